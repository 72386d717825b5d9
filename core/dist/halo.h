/* Point-to-point pieces of a row-band split (the VAE's patch-parallel
 * decode): rank r of a communicator holds the r-th band of rows of an
 * image, top to bottom. Buffers are host memory; sizes are in bytes. */
#ifndef TPGEN_HALO_H
#define TPGEN_HALO_H
#include <mpi.h>
#include <stddef.h>

/* Send `top` (this band's first row) to rank-1 and `bottom` (its last row)
 * to rank+1; receive rank-1's last row into from_above and rank+1's first
 * row into from_below. At the ends (rank 0, the last rank) the receive
 * buffer is left as it is: the caller's zero padding. Collective over c.
 * -1 + tp_error on an MPI failure or a row over 2 GB. */
int dist_halo_rows(MPI_Comm c, const void *top, const void *bottom, void *from_above, void *from_below,
                   size_t bytes);

/* Concatenate every rank's `mine` (counts[r] bytes from rank r) in rank
 * order into `all` (root only when root >= 0; every rank when root < 0).
 * Collective over c. -1 + tp_error on an MPI failure or over 2 GB. */
int dist_gather_bytes(MPI_Comm c, int root, const void *mine, const size_t *counts, void *all);

#endif
