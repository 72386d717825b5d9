/* Data-movement kernels: im2col for convolutions, nearest x2 upsampling,
 * tiled transpose, and embedding-row gathers. */
#include "cuda_dtype.cuh"

/* col[(ci*k + dy)*k + dx][j] = x[ci][(py+dy-k/2)*wd + px+dx-k/2] (0 outside),
 * for output pixel p0 + j = py*wd + px. Row order matches PyTorch's
 * [Cout, Cin, k, k] weight flattened to [Cout, Cin*k*k]. */
__global__ void k_im2col(void *col, int cdt, const void *x, int xdt, int64_t xld, int64_t cin, int64_t h,
                         int64_t wd, int k, int64_t p0, int64_t np) {
    int64_t n = cin * k * k * np;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = i / np, j = i % np;
        int64_t ci = row / (k * k);
        int t = (int)(row % (k * k)), dy = t / k - k / 2, dx = t % k - k / 2;
        int64_t p = p0 + j, py = p / wd + dy, px = p % wd + dx;
        float v = 0.0f;
        if (py >= 0 && py < h && px >= 0 && px < wd) v = ld_el(x, xdt, ci * xld + py * wd + px);
        st_el(col, cdt, i, v);
    }
}

/* op_conv2d_down's im2col: col[(ci*3 + dy)*3 + dx][j] = x[ci][(2oy+dy)*wd + 2ox+dx]
 * (0 past the last row/column), output pixel p0 + j = oy*(wd/2) + ox. */
__global__ void k_im2col_down(void *col, int cdt, const void *x, int xdt, int64_t xld, int64_t cin, int64_t h,
                              int64_t wd, int64_t p0, int64_t np) {
    int64_t n = cin * 9 * np, wo = wd / 2;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = i / np, j = i % np;
        int64_t ci = row / 9;
        int t = (int)(row % 9), dy = t / 3, dx = t % 3;
        int64_t p = p0 + j, py = 2 * (p / wo) + dy, px = 2 * (p % wo) + dx;
        float v = 0.0f;
        if (py < h && px < wd) v = ld_el(x, xdt, ci * xld + py * wd + px);
        st_el(col, cdt, i, v);
    }
}

__global__ void k_upsample2x(void *y, int ydt, int64_t yld, const void *x, int xdt, int64_t xld, int64_t C,
                             int64_t h, int64_t wd) {
    int64_t ow = 2 * wd, n = C * 4 * h * wd;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = i / (4 * h * wd), p = i % (4 * h * wd), oy = p / ow, ox = p % ow;
        st_el(y, ydt, c * yld + p, ld_el(x, xdt, c * xld + (oy / 2) * wd + ox / 2));
    }
}

/* 32x32 tiles through shared memory so both reads and writes coalesce */
__global__ void k_transpose(void *y, int ydt, int64_t yld, const void *x, int xdt, int64_t xld, int64_t rows,
                            int64_t cols) {
    __shared__ float tile[32][33];
    int64_t r0 = (int64_t)blockIdx.y * 32, c0 = (int64_t)blockIdx.x * 32;
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        int64_t r = r0 + i, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[i][threadIdx.x] = ld_el(x, xdt, r * xld + c);
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        int64_t yr = c0 + i, yc = r0 + threadIdx.x;  /* y[yr][yc] = x[yc][yr] */
        if (yr < cols && yc < rows) st_el(y, ydt, yr * yld + yc, tile[threadIdx.x][i]);
    }
}

__global__ void k_gather(void *y, int ydt, int64_t yld, const void *t, int tdt, int64_t tld, int64_t trows,
                         int64_t cols, const int32_t *ids, int64_t n, int64_t row0) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * cols; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i % cols, src = (int64_t)ids[r] - row0;
        float v = (src >= 0 && src < trows) ? ld_el(t, tdt, src * tld + c) : 0.0f;
        st_el(y, ydt, r * yld + c, v);
    }
}

void cuda_im2col(backend *be, void *col, dtype_t cdt, const void *x, dtype_t xdt, int64_t xld, int64_t cin,
                 int64_t h, int64_t wd, int k, int64_t p0, int64_t np) {
    int64_t n = cin * k * k * np;
    if (n == 0) return;
    k_im2col<<<cuda_blocks(n, 256), 256, 0, cuda_stream(be)>>>(col, cdt, x, xdt, xld, cin, h, wd, k, p0, np);
    CUDA_LAUNCHED("im2col");
}

void cuda_im2col_down(backend *be, void *col, dtype_t cdt, const void *x, dtype_t xdt, int64_t xld, int64_t cin,
                      int64_t h, int64_t wd, int64_t p0, int64_t np) {
    int64_t n = cin * 9 * np;
    if (n == 0) return;
    k_im2col_down<<<cuda_blocks(n, 256), 256, 0, cuda_stream(be)>>>(col, cdt, x, xdt, xld, cin, h, wd, p0, np);
    CUDA_LAUNCHED("im2col_down");
}

void cuda_upsample2x(backend *be, tensor *y, const tensor *x, int64_t h, int64_t wd) {
    cuda_need_float(y, "upsample2x");
    cuda_need_float(x, "upsample2x");
    if (x->cols != h * wd || y->rows != x->rows || y->cols != 4 * h * wd)
        tp_fatal("cuda upsample2x: bad shapes (x [%lld,%lld], y [%lld,%lld], %lldx%lld)", (long long)x->rows,
                 (long long)x->cols, (long long)y->rows, (long long)y->cols, (long long)h, (long long)wd);
    int64_t n = y->rows * y->cols;
    if (n == 0) return;
    k_upsample2x<<<cuda_blocks(n, 256), 256, 0, cuda_stream(be)>>>(y->data, y->dtype, y->ld, x->data, x->dtype, x->ld,
                                                                   x->rows, h, wd);
    CUDA_LAUNCHED("upsample2x");
}

void cuda_transpose(backend *be, tensor *y, const tensor *x) {
    cuda_need_float(y, "transpose");
    cuda_need_float(x, "transpose");
    if (y->rows != x->cols || y->cols != x->rows) tp_fatal("cuda transpose: y must be [%lld,%lld]",
                                                           (long long)x->cols, (long long)x->rows);
    if (x->rows == 0 || x->cols == 0) return;
    if ((x->rows + 31) / 32 > 65535) tp_fatal("cuda transpose: too many rows (%lld)", (long long)x->rows);
    dim3 grid((unsigned)((x->cols + 31) / 32), (unsigned)((x->rows + 31) / 32)), block(32, 8);
    k_transpose<<<grid, block, 0, cuda_stream(be)>>>(y->data, y->dtype, y->ld, x->data, x->dtype, x->ld, x->rows,
                                                     x->cols);
    CUDA_LAUNCHED("transpose");
}

void cuda_gather_rows(backend *be, tensor *y, const tensor *table, const int32_t *ids, int64_t n, int64_t row0) {
    cuda_need_float(y, "gather_rows");
    if (!dtype_is_fp8(table->dtype) && table->dtype != DT_GGML) cuda_need_float(table, "gather_rows");
    if (y->rows < n || y->cols != table->cols) tp_fatal("cuda gather_rows: y must be [>=%lld, %lld]", (long long)n,
                                                        (long long)table->cols);
    if (n == 0) return;
    if (table->dtype == DT_GGML) { cuda_gather_rows_ggml(be, y, table, ids, n, row0); return; }   /* a GGUF token_embd */
    /* ids is a host array; a pageable-memory async copy returns once the
     * driver has taken its own copy, so the caller may free ids at once. */
    int32_t *d_ids = (int32_t *)cuda_scratch(be, 2, sizeof(int32_t) * (size_t)n);
    CUDA_CHECK(cudaMemcpyAsync(d_ids, ids, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice, cuda_stream(be)));
    if (dtype_is_fp8(table->dtype)) { cuda_gather_rows_fp8(be, y, table, d_ids, n, row0); return; }
    k_gather<<<cuda_blocks(n * y->cols, 256), 256, 0, cuda_stream(be)>>>(y->data, y->dtype, y->ld, table->data,
                                                                         table->dtype, table->ld, table->rows, y->cols,
                                                                         d_ids, n, row0);
    CUDA_LAUNCHED("gather_rows");
}
