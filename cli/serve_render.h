/* `tpgen serve`, the render side: one request rendered by every rank of a
 * TP group in lockstep on the pipeline library (core/tp_pipe.h), as a
 * one-job run spec over the server's settings, so that its PNG and the
 * PNG's parameters are byte-identical to `tpgen generate` with the same
 * settings. Edits: the uploaded references are checked, hashed and
 * encoded on the group's first rank. */
#ifndef TPGEN_SERVE_RENDER_H
#define TPGEN_SERVE_RENDER_H
#include "generate.h"
#include "serve_ranks.h"

typedef struct serve_ctx {
    gen_setup *g;                /* the server's settings, defaults applied */
    tp_pipe *pipe;
    serve_ranks *ranks;
    int has_encoder;             /* the VAE can encode reference images (same on every rank) */
    /* the job being rendered, and whether (why) it was stopped at a step */
    serve_job *job;
    int cancelled, cancelled_step, cancelled_steps;
    /* a streamed job's partial images: the image being rendered, its
     * size and RGB buffer (group's first rank), a failed preview's message */
    const gen_setup *gs;
    int image, width, height;
    uint8_t *rgb;
    int preview_failed;
    char preview_err[512];
} serve_ctx;

/* Does a stream with `partials` partial images (0..3) show one after step
 * `step` (1-based) of `steps`? Evenly spaced: floor(k·steps/(partials+1)),
 * k = 1..partials, never after the last step nor twice after one. */
int serve_partial_step(int step, int steps, int partials);

/* A serve_render_fn (serve_ranks.h); ctx is a serve_ctx. */
void serve_render(void *ctx, const serve_request *q, serve_job *out);

#endif
