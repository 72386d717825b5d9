/* Halo rows and band gathers over MPI (halo.h). */
#include "halo.h"
#include "kernels/err.h"
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

int dist_halo_rows(MPI_Comm c, const void *top, const void *bottom, void *from_above, void *from_below,
                   size_t bytes) {
    if (bytes > INT_MAX) return tp_error("halo exchange: a row of %zu bytes is over MPI's 2 GB count", bytes);
    int rank, size;
    MPI_Comm_rank(c, &rank);
    MPI_Comm_size(c, &size);
    int up = rank > 0 ? rank - 1 : MPI_PROC_NULL, down = rank + 1 < size ? rank + 1 : MPI_PROC_NULL;
    /* downwards: my last row to the band below, the band above's last row to me; then upwards */
    int rc = MPI_Sendrecv(bottom, (int)bytes, MPI_BYTE, down, 71, from_above, (int)bytes, MPI_BYTE, up, 71, c,
                          MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS)
        rc = MPI_Sendrecv(top, (int)bytes, MPI_BYTE, up, 72, from_below, (int)bytes, MPI_BYTE, down, 72, c,
                          MPI_STATUS_IGNORE);
    return rc == MPI_SUCCESS ? 0 : tp_error("halo exchange: MPI_Sendrecv failed (error %d)", rc);
}

int dist_gather_bytes(MPI_Comm c, int root, const void *mine, const size_t *counts, void *all) {
    int rank, size;
    MPI_Comm_rank(c, &rank);
    MPI_Comm_size(c, &size);
    int *cnt = xmalloc((size_t)size * sizeof(int)), *off = xmalloc((size_t)size * sizeof(int));
    int64_t o = 0;
    for (int r = 0; r < size; r++) {
        cnt[r] = (int)counts[r];
        off[r] = (int)o;
        o += (int64_t)counts[r];
    }
    if (o > INT_MAX) {
        free(cnt); free(off);
        return tp_error("band gather: %lld bytes are over MPI's 2 GB count", (long long)o);
    }
    int rc = root < 0 ? MPI_Allgatherv(mine, cnt[rank], MPI_BYTE, all, cnt, off, MPI_BYTE, c)
                      : MPI_Gatherv(mine, cnt[rank], MPI_BYTE, all, cnt, off, MPI_BYTE, root, c);
    free(cnt);
    free(off);
    return rc == MPI_SUCCESS ? 0 : tp_error("band gather: MPI failed (error %d)", rc);
}
