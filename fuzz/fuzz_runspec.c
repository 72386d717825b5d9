/* libFuzzer harness: the bytes as a YAML run spec (runspec_load_string,
 * then the consistency checks and the output paths), and as a prompts
 * file (runspec_parse_prompt_lines). */
#include "cli/runspec.h"
#include "kernels/err.h"
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    run_spec s;
    runspec_init(&s);
    if (runspec_load_string(&s, text, "fuzz.yaml") == 0 && runspec_check(&s) == 0) {
        int n = runspec_n_jobs(&s);
        for (int j = 0; j < n && j < 4; j++) {
            char *p = s.output ? runspec_output_path(&s, s.output, j) : NULL;
            free(p);
        }
    }
    runspec_free(&s);
    char **prompts = NULL;
    int count = 0;
    if (runspec_parse_prompt_lines(text, size, "fuzz.txt", &prompts, &count) == 0) {
        for (int i = 0; i < count; i++) free(prompts[i]);
        free(prompts);
    }
    free(text);
    return 0;
}
