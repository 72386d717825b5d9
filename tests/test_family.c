/* The model-family rules of cli/model_family.c, each case: model_index.json's
 * _class_name decides when present, guidance_embeds otherwise, and a
 * contradiction is followed with a warning naming both files. */
#include "test.h"
#include "core/flux2_pipe.h"
#include "kernels/err.h"
#include <string.h>

static int resolve(const char *index_json, int ge, model_family *f, const char **name, char *warn) {
    json_t *idx = index_json ? json_loads(index_json, 0, NULL) : NULL;
    int rc = model_family_resolve(idx, "M/model_index.json", ge, "M/transformer/config.json", f, name, warn, 512);
    json_decref(idx);
    return rc;
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
