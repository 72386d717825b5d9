/* The model-family rules of core/model_family.c, each case: the index's
 * _class_name decides when present, the transformer otherwise (FLUX.3's
 * class name and flow_map, FLUX.2's guidance_embeds), and a contradiction
 * is followed with a warning naming both files (FLUX.3: flow_map decides). */
#include "test.h"
#include "core/tp_pipe.h"
#include "kernels/err.h"
#include <string.h>

static int resolve3(const char *index_json, const char *tclass, int ge, int flow_map, model_family *f,
                    const char **name, char *warn) {
    json_t *idx = index_json ? json_loads(index_json, 0, NULL) : NULL;
    family_input in = {.index = idx, .index_path = "M/model_index.json", .transformer_class = tclass,
                       .guidance_embeds = ge, .flow_map = flow_map, .config_path = "M/transformer/config.json"};
    int rc = model_family_resolve(&in, f, name, warn, 512);
    json_decref(idx);
    return rc;
}

static int resolve(const char *index_json, int ge, model_family *f, const char **name, char *warn) {
    return resolve3(index_json, "Flux2Transformer2DModel", ge, 0, f, name, warn);
}

TEST(family_without_class_name_follows_guidance_embeds) {
    model_family f;
    const char *name;
    char w[512];
    CHECK(resolve(NULL, 1, &f, &name, w) == 0 && f == FAMILY_DEV && !w[0], "no index, guidance embeds: dev");
    CHECK(resolve(NULL, 0, &f, &name, w) == 0 && f == FAMILY_KLEIN_BASE && !w[0], "no index, no guidance: klein base");
    CHECK(resolve("{\"is_distilled\": true}", 0, &f, &name, w) == 0 && f == FAMILY_KLEIN_DISTILLED && !w[0],
          "no class, is_distilled: klein distilled");
    CHECK(resolve("{\"_diffusers_version\": \"0.40.0\"}", 1, &f, &name, w) == 0 && f == FAMILY_DEV,
          "index without a class: guidance_embeds decides");
}

TEST(family_follows_class_name) {
    model_family f;
    const char *name;
    char w[512];
    CHECK(resolve("{\"_class_name\": \"Flux2Pipeline\"}", 1, &f, &name, w) == 0 && f == FAMILY_DEV && !w[0] &&
              !strcmp(name, "FLUX.2-dev"), "Flux2Pipeline: dev (%s, '%s')", name, w);
    CHECK(resolve("{\"_class_name\": \"Flux2KleinPipeline\", \"is_distilled\": true}", 0, &f, &name, w) == 0 &&
              f == FAMILY_KLEIN_DISTILLED && !w[0], "Flux2KleinPipeline + is_distilled: klein distilled");
    CHECK(resolve("{\"_class_name\": \"Flux2KleinPipeline\", \"is_distilled\": false}", 0, &f, &name, w) == 0 &&
              f == FAMILY_KLEIN_BASE && !w[0], "Flux2KleinPipeline, is_distilled false: klein base");
    CHECK(resolve("{\"_class_name\": \"Flux2KleinPipeline\"}", 0, &f, &name, w) == 0 && f == FAMILY_KLEIN_BASE,
          "Flux2KleinPipeline without is_distilled: klein base");
    CHECK(resolve("{\"_class_name\": \"Flux2KleinKVPipeline\", \"is_distilled\": true}", 0, &f, &name, w) == 0 &&
              f == FAMILY_KLEIN_KV && strstr(name, "klein-kv"), "Flux2KleinKVPipeline: klein-kv");
}

TEST(family_contradictions_warn_and_follow_the_class) {
    model_family f;
    const char *name;
    char w[512];
    CHECK(resolve("{\"_class_name\": \"Flux2Pipeline\"}", 0, &f, &name, w) == 0 && f == FAMILY_DEV,
          "Flux2Pipeline without guidance embeds is still dev");
    CHECK(strstr(w, "M/model_index.json") && strstr(w, "Flux2Pipeline") && strstr(w, "M/transformer/config.json") &&
              strstr(w, "guidance_embeds false"), "warning names both: '%s'", w);
    CHECK(resolve("{\"_class_name\": \"Flux2KleinPipeline\", \"is_distilled\": true}", 1, &f, &name, w) == 0 &&
              f == FAMILY_KLEIN_DISTILLED, "Flux2KleinPipeline with guidance embeds is still klein");
    CHECK(strstr(w, "Flux2KleinPipeline") && strstr(w, "guidance_embeds true"), "klein warning: '%s'", w);
}

TEST(family_bad_class_names) {
    model_family f;
    const char *name;
    char w[512];
    CHECK(resolve("{\"_class_name\": \"StableDiffusionPipeline\"}", 0, &f, &name, w) != 0 &&
              strstr(tp_error_msg(), "StableDiffusionPipeline") && strstr(tp_error_msg(), "M/model_index.json"),
          "a non-FLUX.2 class: %s", tp_error_msg());
    CHECK(resolve("{\"_class_name\": 3}", 0, &f, &name, w) != 0 && strstr(tp_error_msg(), "_class_name"),
          "a non-string class: %s", tp_error_msg());
}

TEST(family_flux3_from_the_transformer_and_the_modular_index) {
    model_family f;
    const char *name;
    char w[512];
    const char *t3 = "Flux3Transformer2DModel";
    CHECK(resolve3(NULL, t3, 0, 0, &f, &name, w) == 0 && f == FAMILY_FLUX3_BASE && !w[0] && strstr(name, "FLUX.3"),
          "no index, FLUX.3 transformer: base (%s)", name);
    CHECK(resolve3(NULL, t3, 0, 1, &f, &name, w) == 0 && f == FAMILY_FLUX3_FLOWMAP && !w[0],
          "no index, flow_map: flow-map sampler");
    CHECK(resolve3(NULL, t3, 1, 0, &f, &name, w) == 0 && f == FAMILY_FLUX3_BASE, "guidance_embeds means nothing to FLUX.3");
    CHECK(resolve3("{\"_class_name\": \"Flux3ModularPipeline\", \"_blocks_class_name\": \"Flux3AutoBlocks\"}", t3, 0,
                   0, &f, &name, w) == 0 && f == FAMILY_FLUX3_BASE && !w[0], "Flux3ModularPipeline: base");
    CHECK(resolve3("{\"_class_name\": \"Flux3DistilledModularPipeline\"}", t3, 0, 1, &f, &name, w) == 0 &&
              f == FAMILY_FLUX3_FLOWMAP && !w[0] && strstr(name, "flow-map"), "Flux3DistilledModularPipeline: flow-map");
    CHECK(model_family_is_flux3(FAMILY_FLUX3_BASE) && model_family_is_flux3(FAMILY_FLUX3_FLOWMAP) &&
              !model_family_is_flux3(FAMILY_KLEIN_BASE) && !model_family_is_flux3(FAMILY_DEV), "is_flux3");
}

TEST(family_flux3_contradictions) {
    model_family f;
    const char *name;
    char w[512];
    const char *t3 = "Flux3Transformer2DModel";
    /* the sampler follows the weights: flow_map decides, with a warning naming both files */
    CHECK(resolve3("{\"_class_name\": \"Flux3DistilledModularPipeline\"}", t3, 0, 0, &f, &name, w) == 0 &&
              f == FAMILY_FLUX3_BASE && strstr(w, "M/model_index.json") && strstr(w, "M/transformer/config.json") &&
              strstr(w, "flow_map false"), "distilled class over a base transformer: base, warned ('%s')", w);
    CHECK(resolve3("{\"_class_name\": \"Flux3ModularPipeline\"}", t3, 0, 1, &f, &name, w) == 0 &&
              f == FAMILY_FLUX3_FLOWMAP && strstr(w, "flow_map true"), "base class over flow_map: flow-map, warned");
    /* a FLUX.3 class over a FLUX.2 transformer and the reverse: refused naming both */
    CHECK(resolve3("{\"_class_name\": \"Flux3ModularPipeline\"}", "Flux2Transformer2DModel", 0, 0, &f, &name, w) != 0 &&
              strstr(tp_error_msg(), "M/model_index.json") && strstr(tp_error_msg(), "M/transformer/config.json") &&
              strstr(tp_error_msg(), "Flux2Transformer2DModel"), "FLUX.3 class, FLUX.2 transformer: %s", tp_error_msg());
    CHECK(resolve3("{\"_class_name\": \"Flux2KleinPipeline\"}", t3, 0, 0, &f, &name, w) != 0 &&
              strstr(tp_error_msg(), "Flux3Transformer2DModel"), "FLUX.2 class, FLUX.3 transformer: %s", tp_error_msg());
    CHECK(resolve3("{\"_class_name\": \"Flux3Pipeline\"}", t3, 0, 0, &f, &name, w) != 0 &&
              strstr(tp_error_msg(), "Flux3Pipeline") && strstr(tp_error_msg(), "Flux3ModularPipeline"),
          "an unknown FLUX.3 class: %s", tp_error_msg());
}
