/* The run spec: valid specs, every error class with its line and column,
 * flags overriding the spec, output patterns, and the data-parallel split
 * of the batch (each job rendered exactly once). */
#include "test.h"
#include "cli/runspec.h"
#include "core/dist/dist.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <string.h>

static int load(run_spec *s, const char *yaml) {
    runspec_init(s);
    return runspec_load_string(s, yaml, "run.yaml");
}

TEST(runspec_valid_spec) {
    run_spec s;
    const char *y =
        "# a batch\n"
        "model: /models/klein\n"
        "prompts:\n  - a red fox\n  - \"1984\"\n"
        "seeds: {from: 10, count: 3}\n"
        "steps: 4\nguidance: 3.5\nwidth: 96\nheight: 64\n"
        "output: out/{index:04}-{seed}.png\nprecision: f32\nbackend: cpu\ntp: 2\n"
        "save_latents: lat/{prompt_index}_{seed_index}.safetensors\nno_decode: false\n"
        "json_metrics: m.json\nmax_sequence_length: 32\nnegative_prompt: \"\"\n";
    REQUIRE(load(&s, y) == 0, "%s", tp_error_msg());
    CHECK(!strcmp(s.model, "/models/klein"), "model %s", s.model);
    CHECK(s.n_prompts == 2 && !strcmp(s.prompts[1], "1984"), "prompts");
    CHECK(s.n_seeds == 3 && s.seeds[0] == 10 && s.seeds[2] == 12, "seeds");
    CHECK(s.steps == 4 && s.guidance == 3.5 && s.width == 96 && s.height == 64, "numbers");
    CHECK(!strcmp(s.precision, "f32") && !strcmp(s.backend, "cpu") && s.tp == 2, "choices");
    CHECK(s.no_decode == 0 && s.max_sequence_length == 32 && s.negative_prompt && !*s.negative_prompt, "misc");
    CHECK(runspec_check(&s) == 0, "%s", tp_error_msg());
    CHECK(runspec_n_jobs(&s) == 6, "jobs %d", runspec_n_jobs(&s));
    /* job 4 = prompt 1, seed index 1 */
    CHECK(!strcmp(runspec_job_prompt(&s, 4), "1984") && runspec_job_seed(&s, 4) == 11, "job 4");
    char *p = runspec_output_path(&s, s.output, 4);
    CHECK(p && !strcmp(p, "out/0004-11.png"), "output %s", p);
    free(p);
    p = runspec_output_path(&s, s.save_latents, 5);
    CHECK(p && !strcmp(p, "lat/1_2.safetensors"), "latents %s", p);
    free(p);
    runspec_free(&s);
    /* seeds as a list and a single seed */
    REQUIRE(load(&s, "seeds: [5, 18446744073709551615]\n") == 0, "%s", tp_error_msg());
    CHECK(s.n_seeds == 2 && s.seeds[1] == UINT64_MAX, "seed list");
    runspec_free(&s);
    REQUIRE(load(&s, "seed: 3\nprompt: x\n") == 0, "%s", tp_error_msg());
    CHECK(s.n_seeds == 1 && s.seeds[0] == 3 && s.n_prompts == 1, "single seed");
    runspec_free(&s);
}

/* each bad spec must fail with a message containing `want` */
static void bad(const char *yaml, const char *want) {
    run_spec s;
    int rc = load(&s, yaml);
    CHECK(rc == -1, "accepted: %s", yaml);
    if (rc == -1) CHECK(strstr(tp_error_msg(), want) != NULL, "for '%s': message '%s' lacks '%s'", yaml, tp_error_msg(), want);
    runspec_free(&s);
}

TEST(runspec_errors_name_key_line_column) {
    bad("steps: 4\nstepz: 4\n", "run.yaml:2:1: stepz: unknown key 'stepz'");
    bad("prompt-embeds: x\n", "use underscores");
    bad("steps: four\n", "run.yaml:1:8: steps: expected an integer, got 'four'");
    bad("steps: \"4\"\n", "run.yaml:1:8: steps: expected a number");
    bad("steps: [1, 2]\n", "run.yaml:1:8: steps: expected a single value, got a list");
    bad("steps: 0\n", "run.yaml:1:8: steps: 0 is out of range");
    bad("model: x\nwidth: 100\n", "run.yaml:2:8: width: 100 is not a multiple of 16");
    bad("guidance: -1\n", "guidance: -1 is out of range");
    bad("guidance: nan\n", "guidance: expected a number");
    bad("precision: fp16\n", "run.yaml:1:12: precision: expected one of bf16|f32, got 'fp16'");
    bad("no_decode: maybe\n", "no_decode: expected true or false");
    bad("steps:\n", "run.yaml:1:7: steps: has no value");
    bad("seeds: {from: 1}\n", "needs both 'from' and 'count'");
    bad("seeds: {from: 1, count: 0}\n", "seeds.count: 0 is out of range");
    bad("seeds: {from: 1, cnt: 2}\n", "run.yaml:1:18: seeds: unknown key 'cnt'");
    bad("seeds: [1, -2]\n", "run.yaml:1:12: seeds: expected a seed");
    bad("prompts: []\n", "the list is empty");
    bad("prompts: [a, [b]]\n", "item 2 must be a prompt");
    bad("prompt: a\nprompts: [b]\n", "either 'prompt' or 'prompts'");
    bad("steps: 4\nsteps: 5\n", "run.yaml:2:1: steps: the key is given twice");
    bad("- steps: 4\n", "must be a mapping");
    bad("steps: 4\n  width: [\n", "run.yaml:2:");   /* invalid YAML: line of the problem */
    bad("", "empty");
    run_spec s;
    runspec_init(&s);
    CHECK(runspec_load_file(&s, "/nonexistent/run.yaml") == -1 && strstr(tp_error_msg(), "/nonexistent/run.yaml"),
          "unreadable file: %s", tp_error_msg());
    runspec_free(&s);
}

TEST(runspec_flags_override_spec) {
    char path[512];
    snprintf(path, sizeof path, "%s/spec.yaml", test_tmp_dir());
    FILE *f = fopen(path, "w");
    fprintf(f, "model: m\nsteps: 50\nprompts: [a, b]\nseeds: [1, 2]\noutput: o/{index}.png\n");
    fclose(f);
    char *argv[] = {"generate", "--steps", "7", "--spec", path, "--seed=9", "--no-decode", "--save-latents", "l{index}.st", NULL};
    run_spec s;
    runspec_init(&s);
    REQUIRE(runspec_parse_args(&s, 9, argv) == 0, "%s", tp_error_msg());
    CHECK(s.steps == 7, "flag did not override: steps %d", s.steps);
    CHECK(s.n_seeds == 1 && s.seeds[0] == 9, "--seed did not replace the seed list");
    CHECK(s.n_prompts == 2 && !strcmp(s.model, "m") && s.no_decode == 1, "spec values lost");
    CHECK(runspec_check(&s) == 0, "%s", tp_error_msg());
    runspec_free(&s);
    char *bad1[] = {"generate", "--stepz", "3", NULL};
    runspec_init(&s);
    CHECK(runspec_parse_args(&s, 3, bad1) == -1 && strstr(tp_error_msg(), "--stepz"), "unknown flag: %s", tp_error_msg());
    runspec_free(&s);
    char *bad2[] = {"generate", "--width", "1000", NULL};
    runspec_init(&s);
    CHECK(runspec_parse_args(&s, 3, bad2) == -1 && strstr(tp_error_msg(), "--width: 1000 is not a multiple of 16"),
          "width: %s", tp_error_msg());
    runspec_free(&s);
    char *bad3[] = {"generate", "--steps", NULL};
    runspec_init(&s);
    CHECK(runspec_parse_args(&s, 2, bad3) == -1 && strstr(tp_error_msg(), "--steps: expects a value"), "%s", tp_error_msg());
    runspec_free(&s);
}

TEST(runspec_check_consistency) {
    run_spec s;
    REQUIRE(load(&s, "model: m\nprompts: [a, b]\noutput: same.png\n") == 0, "%s", tp_error_msg());
    CHECK(runspec_check(&s) == -1 && strstr(tp_error_msg(), "2 jobs would all write"), "%s", tp_error_msg());
    runspec_free(&s);
    REQUIRE(load(&s, "model: m\nprompts: [a, b]\nseeds: [1, 2]\noutput: o/{prompt}.png\n") == 0, "%s", tp_error_msg());
    CHECK(runspec_check(&s) == -1 && strstr(tp_error_msg(), "jobs 0 and 1 would both write 'o/a.png'"), "%s", tp_error_msg());
    runspec_free(&s);
    REQUIRE(load(&s, "model: m\nprompt: a\nprompt_embeds: e.st\n") == 0, "%s", tp_error_msg());
    CHECK(runspec_check(&s) == -1 && strstr(tp_error_msg(), "not both"), "%s", tp_error_msg());
    runspec_free(&s);
    REQUIRE(load(&s, "model: m\n") == 0, "%s", tp_error_msg());
    CHECK(runspec_check(&s) == -1 && strstr(tp_error_msg(), "nothing to render"), "%s", tp_error_msg());
    runspec_free(&s);
    REQUIRE(load(&s, "model: m\nprompt: a\nno_decode: true\n") == 0, "%s", tp_error_msg());
    CHECK(runspec_check(&s) == -1 && strstr(tp_error_msg(), "would produce nothing"), "%s", tp_error_msg());
    runspec_free(&s);
    REQUIRE(load(&s, "model: m\nprompt: A Red, fox!\noutput: \"{prompt}-{{x}}-{seed:03}.png\"\n") == 0, "%s", tp_error_msg());
    char *p = runspec_output_path(&s, s.output, 0);
    CHECK(p && !strcmp(p, "a-red-fox-{x}-000.png"), "pattern gave %s", p);
    free(p);
    CHECK(runspec_output_path(&s, "{nope}.png", 0) == NULL && strstr(tp_error_msg(), "unknown placeholder"), "%s", tp_error_msg());
    CHECK(runspec_output_path(&s, "{index:4}.png", 0) == NULL, "width without 0 accepted");
    CHECK(runspec_output_path(&s, "{index.png", 0) == NULL, "unclosed brace accepted");
    runspec_free(&s);
}

TEST(runspec_group_split_covers_every_job_once) {
    for (int groups = 1; groups <= 7; groups++)
        for (int n = 0; n <= 23; n++) {
            int seen[32] = {0}, jobs[32];
            for (int g = 0; g < groups; g++) {
                int k = runspec_group_jobs(n, groups, g, jobs);
                for (int i = 0; i < k; i++) {
                    REQUIRE(jobs[i] >= 0 && jobs[i] < n, "job %d out of range", jobs[i]);
                    seen[jobs[i]]++;
                }
            }
            for (int j = 0; j < n; j++) CHECK(seen[j] == 1, "groups %d, %d jobs: job %d done %d times", groups, n, j, seen[j]);
        }
}

/* Across real MPI ranks with tp 2 (tp 1 on one rank): the lead rank of each
 * TP group counts its jobs; the sum over the world shows each job once. */
TEST_MPI(runspec_dp_groups_render_each_job_once) {
    dist d;
    REQUIRE(dist_init(NULL, NULL, &d) == 0, "%s", tp_error_msg());
    int tp = d.world_size % 2 == 0 ? 2 : 1;
    REQUIRE(dist_set_tp(&d, tp) == 0, "%s", tp_error_msg());
    enum { NJ = 11 };
    int count[NJ] = {0}, jobs[NJ];
    int k = runspec_group_jobs(NJ, d.dp, d.dp_rank, jobs);
    if (d.tp_rank == 0)
        for (int i = 0; i < k; i++) count[jobs[i]]++;
    MPI_Allreduce(MPI_IN_PLACE, count, NJ, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    for (int j = 0; j < NJ; j++) CHECK(count[j] == 1, "world %d tp %d: job %d rendered %d times", d.world_size, tp, j, count[j]);
    MPI_Comm_free(&d.tp_comm);
    MPI_Comm_free(&d.dp_comm);
    MPI_Comm_free(&d.local_comm);
}

/* --prompts-file: the line parser on buffers (one prompt per line, blank
 * lines skipped, CRLF and a byte-order mark accepted), its errors with line
 * numbers, and the file as a flag and a spec key (conflicts with prompts). */
static int lines(const char *text, size_t len, char ***l, int *n) {
    return runspec_parse_prompt_lines(text, len, "p.txt", l, n);
}

static void free_lines(char **l, int n) {
    for (int i = 0; i < n; i++) free(l[i]);
    free(l);
}

static void bad_lines(const char *text, size_t len, const char *want) {
    char **l = (char **)1;
    int n = -1;
    int rc = lines(text, len, &l, &n);
    CHECK(rc == -1 && l == NULL && n == 0, "accepted %zu bytes starting '%.20s'", len, text);
    if (rc == -1) CHECK(strstr(tp_error_msg(), want) != NULL, "message '%s' lacks '%s'", tp_error_msg(), want);
}

TEST(runspec_prompt_lines_parse) {
    const char t[] = "\xEF\xBB\xBF" "a red fox\r\n\r\n  \n\xC3\xA9t\xC3\xA9 \xE2\x80\x94 \xF0\x9F\xA6\x8A\n# kept\nlast";
    char **l = NULL;
    int n = 0;
    REQUIRE(lines(t, sizeof t - 1, &l, &n) == 0, "%s", tp_error_msg());
    const char *want[] = {"a red fox", "\xC3\xA9t\xC3\xA9 \xE2\x80\x94 \xF0\x9F\xA6\x8A", "# kept", "last"};
    REQUIRE(n == 4, "%d prompts", n);
    for (int i = 0; i < 4; i++) CHECK(!strcmp(l[i], want[i]), "prompt %d: '%s' (want '%s')", i, l[i], want[i]);
    free_lines(l, n);
    /* a line of exactly the limit is accepted, one byte more is not */
    size_t lim = 64 * 1024;
    char *big = malloc(lim + 8);
    memset(big, 'x', lim + 1);
    memcpy(big + lim + 1, "\nok\n", 4);
    big[0] = 'y', big[lim] = '\n';   /* line 1: lim bytes; line 2: empty; line 3: "ok" */
    REQUIRE(lines(big, lim + 5, &l, &n) == 0, "%s", tp_error_msg());
    CHECK(n == 2 && strlen(l[0]) == lim && l[0][0] == 'y' && !strcmp(l[1], "ok"), "limit line");
    free_lines(l, n);
    memset(big, 'x', lim + 1);   /* line 1: lim + 1 bytes */
    bad_lines(big, lim + 5, "p.txt:1: the line is 65537 bytes long");
    free(big);
}

TEST(runspec_prompt_lines_errors_name_the_line) {
    bad_lines("ok\nfine\n\xC3(\n", 10, "p.txt:3:1: invalid UTF-8 (byte 0xc3)");
    bad_lines("ok\n\nab\xFF\n", 7, "p.txt:3:3: invalid UTF-8 (byte 0xff)");
    bad_lines("a\xED\xA0\x80\n", 5, "p.txt:1:2: invalid UTF-8");          /* a UTF-16 surrogate */
    bad_lines("a\xC0\xAF\n", 4, "p.txt:1:2: invalid UTF-8");              /* overlong '/' */
    bad_lines("one\ntw\0o\n", 8, "p.txt:2:3: a NUL byte");
    bad_lines("", 0, "p.txt: the prompts file has no prompts");
    bad_lines("\n \r\n\t\n", 6, "has no prompts");
    bad_lines("\xEF\xBB\xBF", 3, "has no prompts");
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    REQUIRE(f != NULL, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

TEST(runspec_prompts_file_flag_and_key) {
    char pf[512], sp[512], sp2[512];
    snprintf(pf, sizeof pf, "%s/prompts.txt", test_tmp_dir());
    snprintf(sp, sizeof sp, "%s/pf.yaml", test_tmp_dir());
    snprintf(sp2, sizeof sp2, "%s/pf2.yaml", test_tmp_dir());
    write_text(pf, "first\r\nsecond\n\nthird\n");
    /* as a flag, with seeds from a spec: 3 prompts x 2 seeds */
    write_text(sp, "model: m\nseeds: [7, 8]\noutput: o/{index}.png\nskip_existing: true\n");
    char *a1[] = {"generate", "--spec", sp, "--prompts-file", pf, NULL};
    run_spec s;
    runspec_init(&s);
    REQUIRE(runspec_parse_args(&s, 5, a1) == 0, "%s", tp_error_msg());
    CHECK(s.n_prompts == 3 && !strcmp(s.prompts[0], "first") && !strcmp(s.prompts[2], "third"), "prompts from the file");
    CHECK(s.skip_existing == 1, "skip_existing from the spec");
    CHECK(runspec_check(&s) == 0 && runspec_n_jobs(&s) == 6, "%s", tp_error_msg());
    CHECK(!strcmp(runspec_job_prompt(&s, 3), "second") && runspec_job_seed(&s, 3) == 8, "job 3");
    runspec_free(&s);
    /* as a spec key, and --skip-existing as a flag */
    char yaml[1200];
    snprintf(yaml, sizeof yaml, "model: m\nprompts_file: %s\noutput: o/{index}.png\n", pf);
    write_text(sp2, yaml);
    char *a2[] = {"generate", "--spec", sp2, "--skip-existing", NULL};
    runspec_init(&s);
    REQUIRE(runspec_parse_args(&s, 4, a2) == 0, "%s", tp_error_msg());
    CHECK(s.n_prompts == 3 && s.skip_existing == 1 && !strcmp(s.prompts_file, pf), "spec key");
    runspec_free(&s);
    /* a prompt flag with a prompts file in the spec: error, not a silent choice */
    char *a3[] = {"generate", "--spec", sp2, "--prompt", "x", NULL};
    runspec_init(&s);
    CHECK(runspec_parse_args(&s, 5, a3) == -1 && strstr(tp_error_msg(), "not both"), "%s", tp_error_msg());
    runspec_free(&s);
    /* both in one spec: the file is named */
    snprintf(yaml, sizeof yaml, "prompts: [a]\nprompts_file: %s\n", pf);
    CHECK(load(&s, yaml) == -1 && strstr(tp_error_msg(), "run.yaml: give either 'prompts_file' or 'prompts'"), "%s",
          tp_error_msg());
    runspec_free(&s);
    /* a missing file names the flag and the path */
    char *a4[] = {"generate", "--model", "m", "--prompts-file", "/nonexistent/p.txt", NULL};
    runspec_init(&s);
    CHECK(runspec_parse_args(&s, 5, a4) == -1 && strstr(tp_error_msg(), "--prompts-file /nonexistent/p.txt: cannot open"),
          "%s", tp_error_msg());
    runspec_free(&s);
    /* errors in the file carry its name and the line */
    write_text(pf, "good\n\nbad \xFE\n");
    char *a5[] = {"generate", "--prompts-file", pf, NULL};
    runspec_init(&s);
    CHECK(runspec_parse_args(&s, 3, a5) == -1 && strstr(tp_error_msg(), "prompts.txt:3:5: invalid UTF-8"), "%s",
          tp_error_msg());
    runspec_free(&s);
    /* with prompt embeddings: one or the other */
    write_text(pf, "a\n");
    char *a6[] = {"generate", "--model", "m", "--prompts-file", pf, "--prompt-embeds", "e.st", NULL};
    runspec_init(&s);
    REQUIRE(runspec_parse_args(&s, 7, a6) == 0, "%s", tp_error_msg());
    CHECK(runspec_check(&s) == -1 && strstr(tp_error_msg(), "--prompt-embeds, not both"), "%s", tp_error_msg());
    runspec_free(&s);
}

/* The component keys (a model from single files): spec keys, flags overriding them, the family's choices, and a
 * spec with components but no model passing runspec_check. */
TEST(runspec_component_keys) {
    run_spec s;
    REQUIRE(load(&s, "transformer: /c/diffusion_models/flux2-dev.safetensors\n"
                     "text_encoder: /c/text_encoders/mistral_3_small_flux2_bf16.safetensors\n"
                     "vae: /c/vae/flux2-vae.safetensors\nfamily: dev\nprompt: x\n") == 0, "%s", tp_error_msg());
    CHECK(s.transformer && !strcmp(s.transformer, "/c/diffusion_models/flux2-dev.safetensors"), "transformer %s", s.transformer);
    CHECK(s.text_encoder && strstr(s.text_encoder, "mistral_3_small_flux2_bf16"), "text_encoder %s", s.text_encoder);
    CHECK(s.vae && !strcmp(s.vae, "/c/vae/flux2-vae.safetensors") && s.family && !strcmp(s.family, "dev"), "vae/family");
    CHECK(!s.model && runspec_check(&s) == 0, "components without a model: %s", tp_error_msg());
    char *argv[] = {"generate", "--family", "klein-base", "--vae", "/other/vae", "--text-encoder", "/te"};
    REQUIRE(runspec_parse_args(&s, 7, argv) == 0, "%s", tp_error_msg());
    CHECK(!strcmp(s.family, "klein-base") && !strcmp(s.vae, "/other/vae") && !strcmp(s.text_encoder, "/te"),
          "flags override: %s %s %s", s.family, s.vae, s.text_encoder);
    runspec_free(&s);
    bad("family: schnell\n", "expected one of dev|klein|klein-base, got 'schnell'");
    bad("rng: cuda\n", "expected one of torch2|torch1, got 'cuda'");
    bad("vae: [a, b]\n", "vae");
    runspec_init(&s);
    CHECK(runspec_check(&s) == -1 && strstr(tp_error_msg(), "--transformer PATH"), "no model, no components: %s",
          tp_error_msg());
    runspec_free(&s);
}

/* the start of the noise: rng and initial_latents as keys and flags (the files are checked at setup:
 * tests/sh/rng.sh) */
TEST(runspec_rng_and_initial_latents_keys) {
    run_spec s;
    REQUIRE(load(&s, "model: /m\nprompt: x\nrng: torch1\ninitial_latents: /d/noise.safetensors:lat_{index}\n") == 0,
            "%s", tp_error_msg());
    CHECK(s.rng && !strcmp(s.rng, "torch1"), "rng %s", s.rng);
    CHECK(s.initial_latents && !strcmp(s.initial_latents, "/d/noise.safetensors:lat_{index}"), "initial_latents %s",
          s.initial_latents);
    char *argv[] = {"generate", "--rng", "torch2", "--initial-latents", "/e/x.safetensors"};
    REQUIRE(runspec_parse_args(&s, 5, argv) == 0, "%s", tp_error_msg());
    CHECK(!strcmp(s.rng, "torch2") && !strcmp(s.initial_latents, "/e/x.safetensors"), "flags override: %s %s", s.rng,
          s.initial_latents);
    runspec_free(&s);
    runspec_init(&s);
    char *bad_argv[] = {"generate", "--rng", "philox"};
    CHECK(runspec_parse_args(&s, 3, bad_argv) == -1 && strstr(tp_error_msg(), "torch2|torch1"), "--rng philox: %s",
          tp_error_msg());
    runspec_free(&s);
}

/* cache: the string or a mapping of its keys (joined as key=value; the keys
 * and values are checked at setup by bc_spec_parse); --cache overrides */
TEST(runspec_cache_key) {
    run_spec s;
    REQUIRE(load(&s, "model: /m\nprompt: x\ncache:\n  fn: 2\n  threshold: 0.1\n  taylorseer: 1\n") == 0, "%s",
            tp_error_msg());
    CHECK(s.cache && !strcmp(s.cache, "fn=2,threshold=0.1,taylorseer=1"), "mapping: %s", s.cache);
    char *argv[] = {"generate", "--cache", "fast", "--save-step-latents"};
    REQUIRE(runspec_parse_args(&s, 4, argv) == 0, "%s", tp_error_msg());
    CHECK(!strcmp(s.cache, "fast") && s.save_step_latents, "the flag overrides: %s", s.cache);
    runspec_free(&s);
    REQUIRE(load(&s, "model: /m\nprompt: x\ncache: balanced\n") == 0, "%s", tp_error_msg());
    CHECK(s.cache && !strcmp(s.cache, "balanced"), "string: %s", s.cache);
    runspec_free(&s);
    CHECK(load(&s, "model: /m\nprompt: x\ncache:\n  fn: [1, 2]\n") == -1 && strstr(tp_error_msg(), "cache"),
          "a list value refused naming the key: %s", tp_error_msg());
    runspec_free(&s);
}
