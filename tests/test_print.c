// test_print.c - checks tools/print.c against PyTorch 1.13's str(tensor) text.
//
// The fixtures (golden/print_fixtures.txt, written by golden/gen_print_fixtures.py) hold a few hundred
// float32 tensors with the exact text PyTorch prints for them; every one must come out byte for byte.
// Further cases check the snprintf-like buffer contract, FILE output, invalid arguments and shapes
// that must not crash.
#include "harness.h"
#include "print.h"

#include <errno.h>

#ifndef ATTN_TEST_DATA_DIR
#define ATTN_TEST_DATA_DIR "tests/golden"
#endif

// ---- fixture file -----------------------------------------------------------------------------

typedef struct fixture {
    char name[128];
    int parameter;
    int ndim;
    int64_t shape[ATTN_PRINT_MAX_NDIM];
    char *suffix;   // suffixes joined with '\n' (malloc'd, may be "")
    float *data;    // malloc'd
    int64_t count;
    char *expected; // malloc'd
} fixture;

typedef struct fixture_file {
    char *text;   // the whole file, split into lines in place
    char **lines;
    size_t nlines;
    size_t pos;
} fixture_file;

static void fixture_free(fixture *fx) {
    free(fx->suffix);
    free(fx->data);
    free(fx->expected);
    memset(fx, 0, sizeof(*fx));
}

static void fixture_file_free(fixture_file *ff) {
    free(ff->text);
    free(ff->lines);
    memset(ff, 0, sizeof(*ff));
}

// Reads the fixture file and splits it into lines; returns 0 or -1.
static int fixture_file_load(fixture_file *ff, const char *path) {
    memset(ff, 0, sizeof(*ff));
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t cap = 1 << 20, len = 0;
    char *text = malloc(cap + 1);
    while (text) {
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (len < cap) break;
        char *bigger = realloc(text, cap * 2 + 1);
        if (!bigger) {
            free(text);
            text = NULL;
            break;
        }
        text = bigger;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (!text || bad) {
        free(text);
        return -1;
    }
    text[len] = '\0';
    size_t n = 1;
    for (size_t i = 0; i < len; i++) n += text[i] == '\n';
    ff->lines = malloc(n * sizeof(char *));
    if (!ff->lines) {
        free(text);
        return -1;
    }
    ff->text = text;
    char *p = text;
    while (*p) {
        char *e = strchr(p, '\n');
        if (e) *e = '\0';
        size_t l = strlen(p);
        if (l > 0 && p[l - 1] == '\r') p[l - 1] = '\0';
        ff->lines[ff->nlines++] = p;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

static const char *next_line(fixture_file *ff) { return ff->pos < ff->nlines ? ff->lines[ff->pos++] : NULL; }

// Parses the next fixture; returns 1 on success, 0 at the end of the file, -1 on a syntax error
// (with a message in err).
static int fixture_next(fixture_file *ff, fixture *fx, char *err, size_t errsz) {
    memset(fx, 0, sizeof(*fx));
    const char *l;
    do {
        l = next_line(ff);
        if (!l) return 0;
    } while (l[0] == '#' || l[0] == '\0');
#define PARSE_ERROR(...)                          \
    do {                                          \
        snprintf(err, errsz, __VA_ARGS__);        \
        fixture_free(fx);                         \
        return -1;                                \
    } while (0)
    if (strncmp(l, "case ", 5) != 0) PARSE_ERROR("line %zu: expected 'case'", ff->pos);
    snprintf(fx->name, sizeof(fx->name), "%s", l + 5);

    l = next_line(ff);
    if (!l || strncmp(l, "kind ", 5) != 0) PARSE_ERROR("%s: expected 'kind'", fx->name);
    fx->parameter = strcmp(l + 5, "parameter") == 0;

    l = next_line(ff);
    if (!l || strncmp(l, "shape ", 6) != 0) PARSE_ERROR("%s: expected 'shape'", fx->name);
    char *end;
    long nd = strtol(l + 6, &end, 10);
    if (nd < 0 || nd > ATTN_PRINT_MAX_NDIM) PARSE_ERROR("%s: bad ndim", fx->name);
    fx->ndim = (int)nd;
    for (int d = 0; d < fx->ndim; d++) fx->shape[d] = strtoll(end, &end, 10);

    l = next_line(ff);
    if (!l || strncmp(l, "suffix ", 7) != 0) PARSE_ERROR("%s: expected 'suffix'", fx->name);
    long ns = strtol(l + 7, NULL, 10);
    size_t slen = 1;
    size_t first = ff->pos;
    for (long i = 0; i < ns; i++) {
        l = next_line(ff);
        if (!l) PARSE_ERROR("%s: truncated suffixes", fx->name);
        slen += strlen(l) + 1;
    }
    fx->suffix = calloc(slen, 1);
    if (!fx->suffix) PARSE_ERROR("out of memory");
    for (long i = 0; i < ns; i++) {
        if (i) strcat(fx->suffix, "\n");
        strcat(fx->suffix, ff->lines[first + (size_t)i]);
    }

    l = next_line(ff);
    if (!l || strncmp(l, "data ", 5) != 0) PARSE_ERROR("%s: expected 'data'", fx->name);
    fx->count = strtoll(l + 5, NULL, 10);
    if (fx->count < 0 || fx->count > (int64_t)1 << 26) PARSE_ERROR("%s: bad data count", fx->name);
    fx->data = malloc((size_t)(fx->count ? fx->count : 1) * sizeof(float));
    if (!fx->data) PARSE_ERROR("out of memory");
    int64_t have = 0;
    while (have < fx->count) {
        l = next_line(ff);
        if (!l) PARSE_ERROR("%s: truncated data", fx->name);
        const char *p = l;
        while (*p) {
            while (*p == ' ') p++;
            if (!*p) break;
            uint32_t bits = (uint32_t)strtoul(p, &end, 16);
            if (end == p) PARSE_ERROR("%s: bad data token", fx->name);
            p = end;
            long long rep = 1;
            if (*p == '*') {
                rep = strtoll(p + 1, &end, 10);
                p = end;
            }
            if (rep < 1 || rep > fx->count - have) PARSE_ERROR("%s: too many values", fx->name);
            float v;
            memcpy(&v, &bits, 4);
            for (long long r = 0; r < rep; r++) fx->data[have++] = v;
        }
    }

    l = next_line(ff);
    if (!l || strncmp(l, "expect ", 7) != 0) PARSE_ERROR("%s: expected 'expect'", fx->name);
    long ne = strtol(l + 7, NULL, 10);
    size_t elen = 1;
    first = ff->pos;
    for (long i = 0; i < ne; i++) {
        l = next_line(ff);
        if (!l) PARSE_ERROR("%s: truncated expected text", fx->name);
        elen += strlen(l) + 1;
    }
    fx->expected = malloc(elen);
    if (!fx->expected) PARSE_ERROR("out of memory");
    char *q = fx->expected;
    for (long i = 0; i < ne; i++) {
        const char *s = ff->lines[first + (size_t)i];
        size_t sl = strlen(s);
        if (i) *q++ = '\n';
        memcpy(q, s, sl);
        q += sl;
    }
    *q = '\0';

    l = next_line(ff);
    if (!l || strcmp(l, "end") != 0) PARSE_ERROR("%s: expected 'end'", fx->name);
#undef PARSE_ERROR
    return 1;
}

// ---- helpers ----------------------------------------------------------------------------------

// Formats into a fresh malloc'd string (sized with a first, counting call).
static char *format_alloc(const float *data, int ndim, const int64_t *shape, const char *suffix, int parameter,
                          size_t *len_out) {
    size_t n = parameter ? attn_format_parameter(NULL, 0, data, ndim, shape, suffix)
                         : attn_format_tensor(NULL, 0, data, ndim, shape, suffix);
    char *s = malloc(n + 1);
    if (!s) return NULL;
    size_t m = parameter ? attn_format_parameter(s, n + 1, data, ndim, shape, suffix)
                         : attn_format_tensor(s, n + 1, data, ndim, shape, suffix);
    if (m != n) {
        free(s);
        return NULL;
    }
    if (len_out) *len_out = n;
    return s;
}

static void print_lines(const char *tag, const char *s, int max_lines) {
    int line = 1;
    fprintf(stderr, "      %s line %d: |", tag, line);
    for (const char *p = s; *p; p++) {
        if (*p == '\n') {
            if (++line > max_lines) {
                fprintf(stderr, "|\n      %s ...\n", tag);
                return;
            }
            fprintf(stderr, "|\n      %s line %d: |", tag, line);
        } else {
            fputc(*p, stderr);
        }
    }
    fprintf(stderr, "|\n");
}

// Prints the first differing line of two texts, then both texts (clipped).
static void print_diff(const char *name, const char *want, const char *got) {
    int line = 1;
    const char *w = want, *g = got;
    while (*w && *g) {
        const char *we = strchr(w, '\n'), *ge = strchr(g, '\n');
        size_t wl = we ? (size_t)(we - w) : strlen(w), gl = ge ? (size_t)(ge - g) : strlen(g);
        if (wl != gl || memcmp(w, g, wl) != 0 || !we != !ge) break;
        w += wl + 1;
        g += gl + 1;
        line++;
    }
    const char *we = strchr(w, '\n'), *ge = strchr(g, '\n');
    int wl = (int)(we ? (size_t)(we - w) : strlen(w)), gl = (int)(ge ? (size_t)(ge - g) : strlen(g));
    fprintf(stderr, "    fixture %s: first difference at line %d\n", name, line);
    fprintf(stderr, "      want: |%.*s|\n", wl, w);
    fprintf(stderr, "      got:  |%.*s|\n", gl, g);
    print_lines("want", want, 40);
    print_lines("got ", got, 40);
}

// ---- cases ------------------------------------------------------------------------------------

static void test_fixtures(void) {
    fixture_file ff;
    const char *path = ATTN_TEST_DATA_DIR "/print_fixtures.txt";
    if (fixture_file_load(&ff, path) != 0) FAIL("cannot read %s: %s", path, strerror(errno));
    int total = 0, passed = 0;
    char err[256] = "";
    fixture fx;
    int r;
    while ((r = fixture_next(&ff, &fx, err, sizeof(err))) == 1) {
        total++;
        size_t len = 0;
        char *got = format_alloc(fx.data, fx.ndim, fx.shape, fx.suffix, fx.parameter, &len);
        int ok = got && strcmp(got, fx.expected) == 0;
        if (ok) {
            passed++;
        } else if (total - passed == 1) {
            if (got)
                print_diff(fx.name, fx.expected, got);
            else
                fprintf(stderr, "    fixture %s: formatting failed\n", fx.name);
        }
        free(got);
        fixture_free(&fx);
    }
    fixture_file_free(&ff);
    if (r < 0) FAIL("%s: %s", path, err);
    fprintf(stderr, "    %d of %d fixtures match\n", passed, total);
    ASSERT_TRUE(total >= 300);
    ASSERT_EQ_INT(passed, total);
}

// The same text through every entry point: buffer, counting call, truncated buffers, FILE.
static void test_entry_points_agree(void) {
    fixture_file ff;
    const char *path = ATTN_TEST_DATA_DIR "/print_fixtures.txt";
    if (fixture_file_load(&ff, path) != 0) FAIL("cannot read %s: %s", path, strerror(errno));
    char err[256] = "";
    fixture fx;
    int r, n = 0;
    while ((r = fixture_next(&ff, &fx, err, sizeof(err))) == 1) {
        if (n++ % 7 == 0) {
            size_t len = strlen(fx.expected);
            char small[24];
            size_t caps[] = {1, 2, 9, sizeof(small)};
            for (size_t c = 0; c < sizeof(caps) / sizeof(caps[0]); c++) {
                memset(small, 'X', sizeof(small));
                size_t got = fx.parameter ? attn_format_parameter(small, caps[c], fx.data, fx.ndim, fx.shape, fx.suffix)
                                          : attn_format_tensor(small, caps[c], fx.data, fx.ndim, fx.shape, fx.suffix);
                ASSERT_EQ_INT(got, len);
                size_t kept = len < caps[c] - 1 ? len : caps[c] - 1;
                ASSERT_TRUE(memcmp(small, fx.expected, kept) == 0);
                ASSERT_EQ_INT(small[kept], '\0');
                if (kept + 1 < sizeof(small)) ASSERT_EQ_INT(small[kept + 1], 'X');
            }
            FILE *f = tmpfile();
            if (!f) SKIP("tmpfile() failed");
            int rc = fx.parameter ? attn_print_parameter(f, fx.data, fx.ndim, fx.shape, fx.suffix)
                                  : attn_print_tensor(f, fx.data, fx.ndim, fx.shape, fx.suffix);
            ASSERT_EQ_INT(rc, 0);
            long size = ftell(f);
            ASSERT_EQ_INT(size, (long)len + 1);
            rewind(f);
            char *back = malloc(len + 2);
            ASSERT_TRUE(back != NULL);
            size_t rd = fread(back, 1, len + 1, f);
            fclose(f);
            int same = rd == len + 1 && memcmp(back, fx.expected, len) == 0 && back[len] == '\n';
            free(back);
            ASSERT_TRUE(same);
        }
        fixture_free(&fx);
    }
    fixture_file_free(&ff);
    if (r < 0) FAIL("%s: %s", path, err);
    ASSERT_TRUE(n > 0);
}

static void check_text(const char *want, const float *data, int ndim, const int64_t *shape, const char *suffix,
                       int parameter) {
    size_t len = 0;
    char *got = format_alloc(data, ndim, shape, suffix, parameter, &len);
    ASSERT_TRUE(got != NULL);
    int same = strcmp(got, want) == 0;
    if (!same) print_diff("(inline)", want, got);
    free(got);
    ASSERT_TRUE(same);
}

static void test_examples(void) {
    const float s = 1.8524f;
    check_text("tensor(1.8524)", &s, 0, NULL, NULL, 0);
    const float v[] = {1.0f, 2.0f, 0.0f};
    const int64_t sv[] = {3};
    check_text("tensor([1., 2., 0.])", v, 1, sv, NULL, 0);
    check_text("tensor([1., 2., 0.], grad_fn=<MmBackward0>)", v, 1, sv, "grad_fn=<MmBackward0>", 0);
    check_text("tensor([1., 2., 0.], requires_grad=True, names=('N',))", v, 1, sv,
               "requires_grad=True\nnames=('N',)", 0);
    const int64_t sm[] = {1, 3};
    check_text("Parameter containing:\ntensor([[1., 2., 0.]], requires_grad=True)", v, 2, sm, NULL, 1);
    const int64_t se[] = {0, 3};
    check_text("tensor([], size=(0, 3))", NULL, 2, se, NULL, 0);
    check_text("tensor([], size=(0, 3), requires_grad=True)", NULL, 2, se, "requires_grad=True", 0);
    const int64_t s0[] = {0};
    check_text("tensor([])", NULL, 1, s0, "", 0);
    check_text("Parameter containing:\ntensor([], requires_grad=True)", NULL, 1, s0, NULL, 1);
    const float m[] = {0.5f, 2.0e-5f, -1.0f, 30000.0f};
    const int64_t s22[] = {2, 2};
    check_text("tensor([[ 5.0000e-01,  2.0000e-05],\n        [-1.0000e+00,  3.0000e+04]])", m, 2, s22, NULL, 0);
}

static void test_invalid_arguments(void) {
    const float v[4] = {1, 2, 3, 4};
    const int64_t neg[] = {2, -2};
    char buf[16] = "untouched";
    ASSERT_EQ_INT(attn_format_tensor(buf, sizeof(buf), v, 2, neg, NULL), 0);
    ASSERT_EQ_INT(buf[0], '\0');
    ASSERT_EQ_INT(attn_format_tensor(buf, sizeof(buf), v, -1, neg, NULL), 0);
    ASSERT_EQ_INT(attn_format_tensor(buf, sizeof(buf), v, ATTN_PRINT_MAX_NDIM + 1, neg, NULL), 0);
    ASSERT_EQ_INT(attn_format_tensor(buf, sizeof(buf), v, 2, NULL, NULL), 0);
    const int64_t ok[] = {2, 2};
    ASSERT_EQ_INT(attn_format_tensor(buf, sizeof(buf), NULL, 2, ok, NULL), 0);
    ASSERT_EQ_INT(attn_format_tensor(buf, sizeof(buf), NULL, 0, NULL, NULL), 0);
    const int64_t huge[] = {(int64_t)1 << 40, (int64_t)1 << 40};
    ASSERT_EQ_INT(attn_format_tensor(buf, sizeof(buf), v, 2, huge, NULL), 0);
    ASSERT_EQ_INT(attn_format_tensor(NULL, 0, v, 2, ok, NULL), strlen("tensor([[1., 2.],\n        [3., 4.]])"));
    FILE *f = tmpfile();
    if (!f) SKIP("tmpfile() failed");
    ASSERT_EQ_INT(attn_print_tensor(f, v, 2, neg, NULL), -1);
    ASSERT_EQ_INT(attn_print_parameter(f, NULL, 1, ok, NULL), -1);
    ASSERT_EQ_INT(ftell(f), 0);
    fclose(f);
    ASSERT_EQ_INT(attn_print_tensor(NULL, v, 2, ok, NULL), -1);
}

// Shapes that are large, deep or degenerate: no crash, sane text, only the shown elements read.
static void test_extreme_shapes(void) {
    char buf[256];
    const int64_t zero_huge[] = {0, INT64_MAX};
    ASSERT_EQ_INT(attn_format_tensor(buf, sizeof(buf), NULL, 2, zero_huge, NULL),
                  strlen("tensor([], size=(0, 9223372036854775807))"));
    ASSERT_TRUE(strcmp(buf, "tensor([], size=(0, 9223372036854775807))") == 0);

    // 64 dimensions of extent 1.
    int64_t ones[ATTN_PRINT_MAX_NDIM];
    for (int d = 0; d < ATTN_PRINT_MAX_NDIM; d++) ones[d] = 1;
    const float one = 1.0f;
    char *deep = format_alloc(&one, ATTN_PRINT_MAX_NDIM, ones, NULL, 0, NULL);
    ASSERT_TRUE(deep != NULL);
    ASSERT_EQ_INT(strlen(deep), 7 + 64 + 2 + 64 + 1);
    ASSERT_TRUE(strncmp(deep, "tensor([[[[", 11) == 0 && strstr(deep, "[1.]") != NULL);
    free(deep);

    // Every ndim 0..8 with extent 7 (summarized from ndim 4 on): the text has the right number of
    // "..." markers and no "nan" although the data holds no NaN.
    for (int nd = 0; nd <= 8; nd++) {
        int64_t shape[8];
        int64_t numel = 1;
        for (int d = 0; d < nd; d++) {
            shape[d] = 7;
            numel *= 7;
        }
        float *data = malloc((size_t)numel * sizeof(float));
        ASSERT_TRUE(data != NULL);
        for (int64_t i = 0; i < numel; i++) data[i] = (float)(i % 13) - 6.0f;
        size_t len = attn_format_tensor(NULL, 0, data, nd, shape, NULL);
        char *s = malloc(len + 1);
        ASSERT_TRUE(s != NULL);
        ASSERT_EQ_INT(attn_format_tensor(s, len + 1, data, nd, shape, NULL), len);
        ASSERT_TRUE(strstr(s, "nan") == NULL);
        ASSERT_TRUE(strncmp(s, "tensor(", 7) == 0 && s[len - 1] == ')');
        ASSERT_EQ_INT(strstr(s, "...") != NULL, numel > 1000);
        free(s);
        free(data);
    }
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_fixtures),
        HARNESS_CASE(test_entry_points_agree),
        HARNESS_CASE(test_examples),
        HARNESS_CASE(test_invalid_arguments),
        HARNESS_CASE(test_extreme_shapes),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}
