/* The model family of a pipeline folder, as diffusers picks the pipeline
 * class, from one table (families[] below):
 *
 *  - the pipeline class: model_index.json's _class_name (Flux2Pipeline,
 *    Flux2KleinPipeline (+ is_distilled), Flux2KleinKVPipeline), or
 *    modular_model_index.json's (Flux3ModularPipeline,
 *    Flux3DistilledModularPipeline: what diffusers 0.42.1's
 *    ModularPipeline.save_pretrained writes);
 *  - without a class, the transformer: a config naming
 *    Flux3Transformer2DModel is FLUX.3, its flow_map picking the
 *    flow-map (distilled) sampler; else FLUX.2, guidance_embeds deciding
 *    dev or klein.
 *
 * The transformer decides what can run: a FLUX.3 class over a FLUX.2
 * transformer (or the reverse) is an error naming both files; within a
 * generation, a class that contradicts the transformer (dev without
 * guidance embeds, klein with them, a distilled FLUX.3 class over a config
 * without flow_map) is followed for FLUX.2 and overruled by flow_map for
 * FLUX.3 (the sampler must match the weights), with a warning naming both. */
#include "family.h"
#include "kernels/err.h"
#include <stdio.h>
#include <string.h>

typedef struct family_row {
    const char *cls;            /* pipeline _class_name; NULL: a row chosen by the transformer alone */
    int flux3;                  /* the class needs a Flux3Transformer2DModel */
    model_family plain, distilled;  /* FLUX.2: by is_distilled; FLUX.3: by the transformer's flow_map */
    const char *name_plain, *name_distilled;
} family_row;

static const family_row families[] = {
    {"Flux2Pipeline", 0, FAMILY_DEV, FAMILY_DEV, "FLUX.2-dev", "FLUX.2-dev"},
    {"Flux2KleinPipeline", 0, FAMILY_KLEIN_BASE, FAMILY_KLEIN_DISTILLED, "FLUX.2-klein (base)", "FLUX.2-klein (distilled)"},
    {"Flux2KleinKVPipeline", 0, FAMILY_KLEIN_KV, FAMILY_KLEIN_KV, "FLUX.2-klein-kv", "FLUX.2-klein-kv"},
    {"Flux3ModularPipeline", 1, FAMILY_FLUX3_BASE, FAMILY_FLUX3_FLOWMAP, "FLUX.3 (base)", "FLUX.3 (flow-map)"},
    {"Flux3DistilledModularPipeline", 1, FAMILY_FLUX3_BASE, FAMILY_FLUX3_FLOWMAP, "FLUX.3 (base)", "FLUX.3 (flow-map)"},
};

static const family_row *row_of(model_family f) {
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (families[i].plain == f || families[i].distilled == f) return &families[i];
    return &families[0];
}

const char *model_family_name(model_family f) {
    const family_row *r = row_of(f);
    return f == r->distilled ? r->name_distilled : r->name_plain;
}

int model_family_is_flux3(model_family f) { return f == FAMILY_FLUX3_BASE || f == FAMILY_FLUX3_FLOWMAP; }

const pipe_family *pipe_family_of(model_family f) { return model_family_is_flux3(f) ? &family_flux3 : &family_flux2; }

int model_family_resolve(const family_input *in, model_family *family, const char **name, char *warning,
                         size_t warning_len) {
    if (warning_len) warning[0] = 0;
    const json_t *index = in->index;
    const char *ip = in->index_path ? in->index_path : "model_index.json";
    int distilled = index && json_is_true(json_object_get(index, "is_distilled"));
    const json_t *cls = index ? json_object_get(index, "_class_name") : NULL;
    if (cls && !json_is_string(cls))
        return tp_error("%s: '_class_name' must be a string (the diffusers pipeline class, e.g. Flux2KleinPipeline)", ip);
    const char *c = cls ? json_string_value(cls) : NULL;
    int t3 = in->transformer_class && !strcmp(in->transformer_class, "Flux3Transformer2DModel");
    if (!c) {
        *family = t3 ? (in->flow_map ? FAMILY_FLUX3_FLOWMAP : FAMILY_FLUX3_BASE)
                     : in->guidance_embeds ? FAMILY_DEV : distilled ? FAMILY_KLEIN_DISTILLED : FAMILY_KLEIN_BASE;
        *name = model_family_name(*family);
        return 0;
    }
    const family_row *r = NULL;
    for (size_t i = 0; i < sizeof families / sizeof families[0] && !r; i++)
        if (!strcmp(c, families[i].cls)) r = &families[i];
    if (!r)
        return tp_error("%s: _class_name '%s' is not a pipeline tpgen runs (Flux2Pipeline, Flux2KleinPipeline, "
                        "Flux2KleinKVPipeline, Flux3ModularPipeline, Flux3DistilledModularPipeline); is --model the "
                        "right folder?", ip, c);
    if (r->flux3 != t3)
        return tp_error("%s names %s, a %s pipeline, but %s is %s%s%s; the transformer does not belong to this "
                        "pipeline", ip, c, r->flux3 ? "FLUX.3" : "FLUX.2", in->config_path,
                        t3 ? "a FLUX.3 transformer (Flux3Transformer2DModel)" : "not a FLUX.3 transformer",
                        !t3 && in->transformer_class ? " but " : "", !t3 && in->transformer_class ? in->transformer_class : "");
    if (r->flux3) {
        *family = in->flow_map ? r->distilled : r->plain;
        int says_distilled = strstr(c, "Distilled") != NULL;
        if (says_distilled != (in->flow_map != 0) && warning_len)
            snprintf(warning, warning_len, "%s names %s but %s has flow_map %s; running the %s sampler the weights "
                     "need", ip, c, in->config_path, in->flow_map ? "true" : "false",
                     in->flow_map ? "flow-map (no CFG)" : "base (CFG)");
    } else {
        *family = distilled ? r->distilled : r->plain;
        int dev = *family == FAMILY_DEV;
        if (dev != (in->guidance_embeds != 0) && warning_len)
            snprintf(warning, warning_len,
                     "%s names %s (%s) but %s has guidance_embeds %s, as %s has; following %s", ip, c,
                     model_family_name(*family), in->config_path, in->guidance_embeds ? "true" : "false",
                     dev ? "FLUX.2-klein" : "FLUX.2-dev", ip);
    }
    *name = model_family_name(*family);
    return 0;
}
