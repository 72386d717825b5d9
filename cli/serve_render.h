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
    const serve_job *job;
    int cancelled, cancelled_step, cancelled_steps;
} serve_ctx;

/* A serve_render_fn (serve_ranks.h); ctx is a serve_ctx. */
void serve_render(void *ctx, const serve_request *q, serve_job *out);

#endif
