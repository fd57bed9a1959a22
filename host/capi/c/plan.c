/* Plan one pod's VM from C: `plan POD.json VM.json [OPTIONS_JSON]` prints
 * the report `cocoon-fixup plan --output json` prints, or the error code
 * and message. Built and run by tests/c.rs; the README shows how to build
 * it by hand. */
#include <stdio.h>
#include <stdlib.h>

#include "cocoon_fixup.h"

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0, n;
    *len = 0;
    if (f == NULL) return NULL;
    do {
        if (*len == cap && (buf = realloc(buf, cap = cap * 2 + 4096)) == NULL) break;
        n = fread(buf + *len, 1, cap - *len, f);
        *len += n;
    } while (n > 0);
    fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    size_t pod_len, vm_len;
    cf_planner *planner;
    char *out;
    if (argc < 3) {
        fprintf(stderr, "usage: %s POD.json VM.json [OPTIONS_JSON]\n", argv[0]);
        return 2;
    }
    char *pod = slurp(argv[1], &pod_len), *vm = slurp(argv[2], &vm_len);
    if (pod == NULL || vm == NULL) {
        perror("reading the pod or the VM");
        return 2;
    }
    CfStatus status = cf_planner_new(argc > 3 ? argv[3] : NULL, &planner, &out);
    if (status == CF_OK) {
        cf_string_free(out);
        status = cf_plan(planner, (const uint8_t *)pod, pod_len, (const uint8_t *)vm, vm_len, NULL, &out);
        cf_planner_free(planner);
    }
    if (status == CF_OK) printf("%s\n", out);
    else fprintf(stderr, "error %d: %s\n", (int)status, out);
    cf_string_free(out);
    free(pod);
    free(vm);
    return status == CF_OK ? 0 : 1;
}
