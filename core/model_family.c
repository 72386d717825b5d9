/* The model family of a pipeline folder, as diffusers picks the pipeline
 * class: model_index.json's _class_name when present (Flux2Pipeline: dev,
 * Flux2KleinPipeline: klein, distilled when is_distilled is true,
 * Flux2KleinKVPipeline: klein-kv); the transformer config's
 * guidance_embeds decides only when there is no class name. A class that
 * contradicts the transformer (dev without guidance embeds, klein with
 * them) is followed, with a warning naming both. */
#include "flux2_pipe.h"
#include "kernels/err.h"
#include <stdio.h>
#include <string.h>

static const char *family_name(model_family f) {
    switch (f) {
    case FAMILY_DEV: return "FLUX.2-dev";
    case FAMILY_KLEIN_DISTILLED: return "FLUX.2-klein (distilled)";
    case FAMILY_KLEIN_BASE: return "FLUX.2-klein (base)";
    default: return "FLUX.2-klein-kv";
    }
}

int model_family_resolve(const json_t *index, const char *index_path, int guidance_embeds, const char *config_path,
                         model_family *family, const char **name, char *warning, size_t warning_len) {
    if (warning_len) warning[0] = 0;
    int distilled = index && json_is_true(json_object_get(index, "is_distilled"));
    const json_t *cls = index ? json_object_get(index, "_class_name") : NULL;
    if (cls && !json_is_string(cls))
        return tp_error("%s: '_class_name' must be a string (the diffusers pipeline class, e.g. Flux2KleinPipeline)",
                        index_path);
    const char *c = cls ? json_string_value(cls) : NULL;
    if (!c) {
        *family = guidance_embeds ? FAMILY_DEV : distilled ? FAMILY_KLEIN_DISTILLED : FAMILY_KLEIN_BASE;
    } else if (!strcmp(c, "Flux2Pipeline")) {
        *family = FAMILY_DEV;
    } else if (!strcmp(c, "Flux2KleinPipeline")) {
        *family = distilled ? FAMILY_KLEIN_DISTILLED : FAMILY_KLEIN_BASE;
    } else if (!strcmp(c, "Flux2KleinKVPipeline")) {
        *family = FAMILY_KLEIN_KV;
    } else {
        return tp_error("%s: _class_name '%s' is not a FLUX.2 pipeline (tpgen runs Flux2Pipeline, Flux2KleinPipeline "
                        "and recognises Flux2KleinKVPipeline); is --model the right folder?", index_path, c);
    }
    *name = family_name(*family);
    int dev = *family == FAMILY_DEV;
    if (c && dev != (guidance_embeds != 0) && warning_len)
        snprintf(warning, warning_len,
                 "%s names %s (%s) but %s has guidance_embeds %s, as %s has; following model_index.json", index_path, c,
                 *name, config_path, guidance_embeds ? "true" : "false", dev ? "FLUX.2-klein" : "FLUX.2-dev");
    return 0;
}
