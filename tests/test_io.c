// test_io.c - tests of the tensor-file layer: the JSON parser, file helpers, .npy and .safetensors.
//
// Fixtures come from tests/golden/gen_io_fixtures.py (numpy-written .npy files, Python-written
// .safetensors files) in ATTN_TEST_DATA_DIR/io. Damaged and lying files are made here from those
// bytes or from scratch. A counting allocator checks that nothing leaks, that each allocation
// failure is reported cleanly, and that no allocation sized by a lying header is attempted.
// Scratch files go to a fresh directory under $TMPDIR (or /tmp), removed at the end of each case.
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attn.h"
#include "harness.h"
#include "io/file.h"
#include "io/json.h"

#define FIXTURE(name) ATTN_TEST_DATA_DIR "/io/" name

// ---- counting allocator ------------------------------------------------------------------------

typedef struct counting {
    long allocs;       // calls to alloc
    long live;         // allocations not yet freed
    size_t max_request;
    long fail_at;      // index of the alloc call to fail, -1 for none
} counting;

static void *counting_alloc(void *user, size_t size, size_t align) {
    counting *c = user;
    long index = c->allocs++;
    if (size > c->max_request) c->max_request = size;
    if (index == c->fail_at) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size) != 0) return NULL;
    c->live++;
    return p;
}

static void counting_free(void *user, void *p) {
    counting *c = user;
    if (p != NULL) c->live--;
    free(p);
}

static attn_ctx *make_ctx(counting *c) {
    memset(c, 0, sizeof *c);
    c->fail_at = -1;
    attn_ctx_params p;
    attn_ctx_params_init(&p);
    p.allocator.alloc = counting_alloc;
    p.allocator.free = counting_free;
    p.allocator.user = c;
    attn_ctx *ctx = NULL;
    ASSERT_OK(attn_ctx_create(&p, &ctx));
    return ctx;
}

// Frees the context and checks that it was the last live allocation.
static void free_ctx(attn_ctx *ctx, counting *c) {
    ASSERT_EQ_INT(c->live, 1);
    attn_ctx_free(ctx);
    ASSERT_EQ_INT(c->live, 0);
}

// ---- files and bytes ---------------------------------------------------------------------------

typedef struct bytes {
    unsigned char *p;
    size_t n;
} bytes;

static bytes slurp(const char *path) {
    bytes b = {NULL, 0};
    FILE *f = fopen(path, "rb");
    if (f == NULL) FAIL("cannot open %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    b.p = malloc((size_t)n + 1);
    b.n = fread(b.p, 1, (size_t)n, f);
    fclose(f);
    if (b.n != (size_t)n) FAIL("short read of %s", path);
    return b;
}

static void spit(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f == NULL) FAIL("cannot create %s: %s", path, strerror(errno));
    if (n > 0 && fwrite(p, 1, n, f) != n) FAIL("cannot write %s", path);
    fclose(f);
}

static bool same_bytes(bytes a, bytes b) { return a.n == b.n && (a.n == 0 || memcmp(a.p, b.p, a.n) == 0); }

static char tmp_dir[512];

// A fresh empty directory for the current case.
static const char *make_tmp_dir(void) {
    const char *base = getenv("TMPDIR");
    if (base == NULL || base[0] == '\0') base = "/tmp";
    snprintf(tmp_dir, sizeof tmp_dir, "%s/attn_test_io.XXXXXX", base);
    if (mkdtemp(tmp_dir) == NULL) FAIL("mkdtemp: %s", strerror(errno));
    return tmp_dir;
}

static const char *in_tmp(const char *name) {
    static char buf[16][1024]; // a ring: each result stays valid for the next 15 calls
    static int k;
    k = (k + 1) % 16;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp_dir, name);
    return buf[k];
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) FAIL("opendir %s: %s", dir, strerror(errno));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    return n;
}

// Removes tmp_dir and what is in it (files and empty subdirectories).
static void remove_tmp_dir(void) {
    DIR *d = opendir(tmp_dir);
    if (d == NULL) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        const char *p = in_tmp(e->d_name);
        if (unlink(p) != 0) rmdir(p);
    }
    closedir(d);
    rmdir(tmp_dir);
}

static bool contains(const char *haystack, const char *needle) { return strstr(haystack, needle) != NULL; }

#define ASSERT_MSG_HAS(ctx, needle)                                                                   \
    do {                                                                                              \
        harness_checks++;                                                                             \
        if (!contains(attn_ctx_last_error(ctx), (needle)))                                            \
            FAIL("error message \"%s\" lacks \"%s\"", attn_ctx_last_error(ctx), (needle));           \
    } while (0)

static float half_to_float(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m + 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

// ---- expected fixture values (see gen_io_fixtures.py) ------------------------------------------

static void check_f32_2x3(const attn_tensor *t) {
    ASSERT_EQ_INT(t->dtype, ATTN_DTYPE_F32);
    ASSERT_EQ_INT(t->ndim, 2);
    ASSERT_EQ_INT(t->shape[0], 2);
    ASSERT_EQ_INT(t->shape[1], 3);
    const float *x = t->data;
    for (int i = 0; i < 6; i++) ASSERT_TRUE(x[i] == (float)i * 0.25f - 1.0f);
}

static void check_f64_5(const attn_tensor *t) {
    ASSERT_EQ_INT(t->dtype, ATTN_DTYPE_F64);
    ASSERT_EQ_INT(t->ndim, 1);
    ASSERT_EQ_INT(t->shape[0], 5);
    const double *x = t->data;
    for (int i = 0; i < 5; i++) ASSERT_TRUE(x[i] == (double)i / 3.0);
}

static void check_f16_2x3x4(const attn_tensor *t) {
    ASSERT_EQ_INT(t->dtype, ATTN_DTYPE_F16);
    ASSERT_EQ_INT(t->ndim, 3);
    ASSERT_EQ_INT(t->shape[0] * 100 + t->shape[1] * 10 + t->shape[2], 234);
    const uint16_t *x = t->data;
    for (int i = 0; i < 24; i++) ASSERT_TRUE(half_to_float(x[i]) == (float)(i - 12) * 0.5f);
}

static void check_bool_7(const attn_tensor *t) {
    ASSERT_EQ_INT(t->dtype, ATTN_DTYPE_BOOL);
    ASSERT_EQ_INT(t->ndim, 1);
    ASSERT_EQ_INT(t->shape[0], 7);
    const uint8_t *x = t->data;
    for (int i = 0; i < 7; i++) ASSERT_EQ_INT(x[i], i % 3 == 0);
}

static void check_u8_2x2(const attn_tensor *t) {
    ASSERT_EQ_INT(t->dtype, ATTN_DTYPE_U8);
    ASSERT_EQ_INT(t->ndim, 2);
    const uint8_t *x = t->data;
    ASSERT_TRUE(x[0] == 0 && x[1] == 1 && x[2] == 254 && x[3] == 255);
}

static void check_i32_3(const attn_tensor *t) {
    ASSERT_EQ_INT(t->dtype, ATTN_DTYPE_I32);
    ASSERT_EQ_INT(t->shape[0], 3);
    const int32_t *x = t->data;
    ASSERT_TRUE(x[0] == INT32_MIN && x[1] == 0 && x[2] == INT32_MAX);
}

static void check_i64_2x2(const attn_tensor *t) {
    ASSERT_EQ_INT(t->dtype, ATTN_DTYPE_I64);
    ASSERT_EQ_INT(t->ndim, 2);
    const int64_t *x = t->data;
    ASSERT_TRUE(x[0] == INT64_MIN && x[1] == -1 && x[2] == 0 && x[3] == INT64_MAX);
}

static void check_scalar_f32(const attn_tensor *t) {
    ASSERT_EQ_INT(t->dtype, ATTN_DTYPE_F32);
    ASSERT_EQ_INT(t->ndim, 0);
    ASSERT_EQ_INT(attn_tensor_numel(t), 1);
    ASSERT_TRUE(*(const float *)t->data == 3.5f);
}

static void check_empty_f32_0x3(const attn_tensor *t) {
    ASSERT_EQ_INT(t->dtype, ATTN_DTYPE_F32);
    ASSERT_EQ_INT(t->ndim, 2);
    ASSERT_EQ_INT(t->shape[0], 0);
    ASSERT_EQ_INT(t->shape[1], 3);
    ASSERT_EQ_INT(attn_tensor_numel(t), 0);
}

static void check_f32_1d_7(const attn_tensor *t) {
    ASSERT_EQ_INT(t->dtype, ATTN_DTYPE_F32);
    ASSERT_EQ_INT(t->ndim, 1);
    ASSERT_EQ_INT(t->shape[0], 7);
    const float *x = t->data;
    for (int i = 0; i < 7; i++) ASSERT_TRUE(x[i] == (float)i * 0.25f - 1.0f);
}

typedef struct npy_fixture {
    const char *file;
    void (*check)(const attn_tensor *t);
} npy_fixture;

static const npy_fixture npy_fixtures[] = {
    {FIXTURE("f32_2x3.npy"), check_f32_2x3},         {FIXTURE("f64_5.npy"), check_f64_5},
    {FIXTURE("f16_2x3x4.npy"), check_f16_2x3x4},     {FIXTURE("bool_7.npy"), check_bool_7},
    {FIXTURE("u8_2x2.npy"), check_u8_2x2},           {FIXTURE("i32_3.npy"), check_i32_3},
    {FIXTURE("i64_2x2.npy"), check_i64_2x2},         {FIXTURE("scalar_f32.npy"), check_scalar_f32},
    {FIXTURE("empty_f32_0x3.npy"), check_empty_f32_0x3}, {FIXTURE("f32_1d_7.npy"), check_f32_1d_7},
};
#define N_NPY_FIXTURES ((int)(sizeof npy_fixtures / sizeof npy_fixtures[0]))

// ================================================================================================
// tensor helpers
// ================================================================================================

static void test_tensor_helpers(void) {
    attn_tensor t;
    memset(&t, 0, sizeof t);
    ASSERT_EQ_INT(attn_tensor_numel(&t), 1); // ndim 0
    t.ndim = 2;
    t.shape[0] = 2;
    t.shape[1] = 3;
    ASSERT_EQ_INT(attn_tensor_numel(&t), 6);
    t.shape[1] = 0;
    ASSERT_EQ_INT(attn_tensor_numel(&t), 0);
    t.shape[0] = INT64_C(1) << 40;
    t.shape[1] = INT64_C(1) << 40;
    ASSERT_EQ_INT(attn_tensor_numel(&t), -1);
    t.shape[1] = -1;
    ASSERT_EQ_INT(attn_tensor_numel(&t), -1);
    t.ndim = ATTN_MAX_DIMS + 1;
    ASSERT_EQ_INT(attn_tensor_numel(&t), -1);
    ASSERT_EQ_INT(attn_tensor_numel(NULL), -1);

    attn_tensor items[2];
    memset(items, 0, sizeof items);
    items[0].name = "alpha";
    items[1].name = "beta";
    attn_tensor_list list = {2, items};
    ASSERT_TRUE(attn_tensor_list_find(&list, "beta") == &items[1]);
    ASSERT_TRUE(attn_tensor_list_find(&list, "gamma") == NULL);
    ASSERT_TRUE(attn_tensor_list_find(&list, NULL) == NULL);
    ASSERT_TRUE(attn_tensor_list_find(NULL, "alpha") == NULL);
    // Releasing NULLs or zeroed structs is harmless.
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    attn_tensor z;
    memset(&z, 0, sizeof z);
    attn_tensor_release(ctx, &z);
    attn_tensor_release(ctx, NULL);
    attn_tensor_release(NULL, &z);
    attn_tensor_list zl = {0, NULL};
    attn_tensor_list_release(ctx, &zl);
    attn_tensor_list_release(ctx, NULL);
    free_ctx(ctx, &c);
}

// ================================================================================================
// JSON
// ================================================================================================

static attn_status parse_str(attn_ctx *ctx, const char *s, attn__json_doc *doc) {
    return attn__json_parse(ctx, s, strlen(s), NULL, doc);
}

static void test_json_values(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    attn__json_doc doc;
    const char *text = " {\"a\": [1, -2, 3.5, 1e2, true, false, null, \"s\"], \"b\": {\"c\": {}}, \"\": [] , "
                       "\"k\\u00e9y\": 0} \n";
    ASSERT_OK(parse_str(ctx, text, &doc));
    const attn__json *root = doc.root;
    ASSERT_EQ_INT(attn__json_kind(root), ATTN__JSON_OBJECT);
    ASSERT_EQ_INT(attn__json_len(root), 4);
    ASSERT_EQ_INT(attn__json_offset(root), 1);
    const attn__json *a = attn__json_get(root, "a");
    ASSERT_EQ_INT(attn__json_kind(a), ATTN__JSON_ARRAY);
    ASSERT_EQ_INT(attn__json_len(a), 8);
    int64_t i64 = 0;
    double d = 0;
    bool b = false;
    ASSERT_TRUE(attn__json_int64(attn__json_at(a, 0), &i64) && i64 == 1);
    ASSERT_TRUE(attn__json_int64(attn__json_at(a, 1), &i64) && i64 == -2);
    ASSERT_TRUE(!attn__json_is_int(attn__json_at(a, 2)));
    ASSERT_TRUE(attn__json_number(attn__json_at(a, 2), &d) && d == 3.5);
    ASSERT_TRUE(!attn__json_is_int(attn__json_at(a, 3))); // 1e2 is not written as an integer
    ASSERT_TRUE(attn__json_number(attn__json_at(a, 3), &d) && d == 100.0);
    ASSERT_TRUE(attn__json_number(attn__json_at(a, 0), &d) && d == 1.0);
    ASSERT_TRUE(attn__json_bool(attn__json_at(a, 4), &b) && b);
    ASSERT_TRUE(attn__json_bool(attn__json_at(a, 5), &b) && !b);
    ASSERT_TRUE(attn__json_is_null(attn__json_at(a, 6)));
    size_t len = 0;
    ASSERT_TRUE(strcmp(attn__json_string(attn__json_at(a, 7), &len), "s") == 0 && len == 1);
    ASSERT_TRUE(attn__json_at(a, 8) == NULL);
    ASSERT_TRUE(attn__json_string(attn__json_at(a, 0), NULL) == NULL);
    ASSERT_TRUE(!attn__json_number(attn__json_at(a, 7), &d));
    ASSERT_EQ_INT(attn__json_kind(attn__json_get(attn__json_get(root, "b"), "c")), ATTN__JSON_OBJECT);
    ASSERT_EQ_INT(attn__json_len(attn__json_get(attn__json_get(root, "b"), "c")), 0);
    ASSERT_EQ_INT(attn__json_kind(attn__json_get(root, "")), ATTN__JSON_ARRAY);
    ASSERT_TRUE(attn__json_get(root, "k\xc3\xa9y") != NULL);
    ASSERT_TRUE(attn__json_get(root, "missing") == NULL);
    const attn__json *m = attn__json_at(root, 1);
    ASSERT_TRUE(strcmp(attn__json_key(m, &len), "b") == 0 && len == 1);
    ASSERT_TRUE(attn__json_key(root, NULL) == NULL);
    // NULL-safe accessors.
    ASSERT_EQ_INT(attn__json_kind(NULL), ATTN__JSON_NONE);
    ASSERT_EQ_INT(attn__json_len(NULL), 0);
    ASSERT_TRUE(attn__json_at(NULL, 0) == NULL && attn__json_get(NULL, "a") == NULL);
    ASSERT_TRUE(!attn__json_number(NULL, &d) && !attn__json_int64(NULL, &i64) && !attn__json_bool(NULL, &b));
    ASSERT_TRUE(!attn__json_is_null(NULL) && attn__json_string(NULL, NULL) == NULL);
    ASSERT_TRUE(strcmp(attn__json_kind_name(ATTN__JSON_STRING), "string") == 0);
    attn__json_free(ctx, &doc);
    ASSERT_TRUE(doc.root == NULL);
    attn__json_free(ctx, &doc); // twice is harmless

    // Scalars at the top level.
    ASSERT_OK(parse_str(ctx, "42", &doc));
    ASSERT_TRUE(attn__json_int64(doc.root, &i64) && i64 == 42);
    attn__json_free(ctx, &doc);
    ASSERT_OK(parse_str(ctx, "\"x\"", &doc));
    ASSERT_TRUE(strcmp(attn__json_string(doc.root, NULL), "x") == 0);
    attn__json_free(ctx, &doc);
    free_ctx(ctx, &c);
}

static void test_json_strings(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    attn__json_doc doc;
    size_t len;
    ASSERT_OK(parse_str(ctx, "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", &doc));
    ASSERT_TRUE(strcmp(attn__json_string(doc.root, &len), "\"\\/\b\f\n\r\t") == 0 && len == 8);
    attn__json_free(ctx, &doc);
    // \u escapes: 1, 2, 3-byte UTF-8, a surrogate pair (U+1F600) and an embedded NUL.
    ASSERT_OK(parse_str(ctx, "\"\\u0041\\u00e9\\u20AC\\ud83d\\ude00\\u0000z\"", &doc));
    const char *s = attn__json_string(doc.root, &len);
    ASSERT_EQ_INT(len, 1 + 2 + 3 + 4 + 1 + 1);
    ASSERT_TRUE(memcmp(s, "A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\0z", len) == 0);
    attn__json_free(ctx, &doc);
    // Raw UTF-8 is kept as is.
    ASSERT_OK(parse_str(ctx, "\"caf\xc3\xa9 \xf0\x9f\x98\x80\"", &doc));
    ASSERT_TRUE(strcmp(attn__json_string(doc.root, NULL), "caf\xc3\xa9 \xf0\x9f\x98\x80") == 0);
    attn__json_free(ctx, &doc);

    // Writing escapes what must be escaped; parsing it back gives the original bytes.
    const char raw[] = "a\"b\\c\n\x01\x1f/\xc3\xa9";
    size_t n = attn__json_write_string(NULL, raw, sizeof raw - 1);
    char buf[64];
    ASSERT_EQ_INT(attn__json_write_string(buf, raw, sizeof raw - 1), n);
    ASSERT_TRUE(n == strlen("\"a\\\"b\\\\c\\n\\u0001\\u001f/\xc3\xa9\"") &&
                memcmp(buf, "\"a\\\"b\\\\c\\n\\u0001\\u001f/\xc3\xa9\"", n) == 0);
    ASSERT_OK(attn__json_parse(ctx, buf, n, NULL, &doc));
    ASSERT_TRUE(attn__json_string(doc.root, &len) != NULL && len == sizeof raw - 1);
    ASSERT_TRUE(memcmp(attn__json_string(doc.root, NULL), raw, len) == 0);
    attn__json_free(ctx, &doc);
    ASSERT_TRUE(attn__json_utf8_valid("caf\xc3\xa9", 5));
    ASSERT_TRUE(!attn__json_utf8_valid("\xc3", 1));
    ASSERT_TRUE(!attn__json_utf8_valid("\xed\xa0\x80", 3)); // surrogate
    ASSERT_TRUE(!attn__json_utf8_valid("\xf4\x90\x80\x80", 4)); // > U+10FFFF
    free_ctx(ctx, &c);
}

static void test_json_numbers(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    attn__json_doc doc;
    static const struct {
        const char *text;
        double value;
        int is_int;
    } cases[] = {
        {"0", 0.0, 1},
        {"-0", 0.0, 1},
        {"-0.0", -0.0, 0},
        {"9223372036854775807", 9223372036854775807.0, 1},
        {"-9223372036854775808", -9223372036854775808.0, 1},
        {"9223372036854775808", 9223372036854775808.0, 0}, // beyond int64: still a number
        {"123456789012345678901234567890", 123456789012345678901234567890.0, 0},
        {"0.1", 0.1, 0},
        {"1.0", 1.0, 0},
        {"2.5E-3", 2.5e-3, 0},
        {"1e+2", 100.0, 0},
        {"0.12345679104328156", 0.12345679104328156, 0},
        {"1.7976931348623157e308", 1.7976931348623157e308, 0},
        {"4.9406564584124654e-324", 4.9406564584124654e-324, 0},
        {"2.4703282292062328e-324", 4.9406564584124654e-324, 0}, // just above half the smallest: rounds up
        {"1e-400", 0.0, 0},
        {"1e-99999999999999999999", 0.0, 0},
        {"0.000000000000000000000000000001", 1e-30, 0},
        {"3.4028235e38", 3.4028235e38, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ASSERT_OK(parse_str(ctx, cases[i].text, &doc));
        double d = -1;
        ASSERT_TRUE(attn__json_number(doc.root, &d));
        if (d != cases[i].value || signbit(d) != signbit(cases[i].value))
            FAIL("%s parsed as %.17g, expected %.17g", cases[i].text, d, cases[i].value);
        ASSERT_EQ_INT(attn__json_is_int(doc.root), cases[i].is_int);
        attn__json_free(ctx, &doc);
    }
    // A long mantissa (900 digits) is rounded correctly: compare with strtod in the C locale.
    char big[1000];
    strcpy(big, "0.");
    for (int i = 0; i < 900; i++) big[2 + i] = (char)('0' + (i * 7 + 3) % 10);
    big[902] = '\0';
    ASSERT_OK(parse_str(ctx, big, &doc));
    double d;
    ASSERT_TRUE(attn__json_number(doc.root, &d) && d == strtod(big, NULL));
    attn__json_free(ctx, &doc);
    // Halfway case between two doubles decided by a digit far beyond 17 significant digits:
    // 1 + 2^-53 is exactly halfway between 1 and 1 + 2^-52; any nonzero digit after it rounds up.
    const char *halfway = "1.00000000000000011102230246251565404236316680908203125";
    ASSERT_OK(parse_str(ctx, halfway, &doc));
    ASSERT_TRUE(attn__json_number(doc.root, &d) && d == 1.0); // ties to even
    attn__json_free(ctx, &doc);
    char above[1200];
    snprintf(above, sizeof above, "%s", halfway);
    size_t k = strlen(above);
    for (int i = 0; i < 1000; i++) above[k++] = '0';
    above[k++] = '1';
    above[k] = '\0';
    ASSERT_OK(parse_str(ctx, above, &doc));
    ASSERT_TRUE(attn__json_number(doc.root, &d) && d == 1.0 + 0x1p-52);
    attn__json_free(ctx, &doc);
    // Non-finite numbers only with the option.
    attn__json_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.allow_nonfinite = true;
    const char *nf = "[NaN, Infinity, -Infinity, 1]";
    ASSERT_STATUS(parse_str(ctx, nf, &doc), ATTN_ERR_BAD_FILE);
    ASSERT_OK(attn__json_parse(ctx, nf, strlen(nf), &opts, &doc));
    ASSERT_TRUE(attn__json_number(attn__json_at(doc.root, 0), &d) && isnan(d));
    ASSERT_TRUE(attn__json_number(attn__json_at(doc.root, 1), &d) && d == INFINITY);
    ASSERT_TRUE(attn__json_number(attn__json_at(doc.root, 2), &d) && d == -INFINITY);
    attn__json_free(ctx, &doc);
    ASSERT_STATUS(attn__json_parse(ctx, "-NaN", 4, &opts, &doc), ATTN_ERR_BAD_FILE);
    ASSERT_STATUS(attn__json_parse(ctx, "Inf", 3, &opts, &doc), ATTN_ERR_BAD_FILE);
    free_ctx(ctx, &c);
}

static void test_json_errors(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    static const struct {
        const char *text;
        size_t len; // 0: strlen
        size_t at;  // expected byte offset in the message
    } bad[] = {
        {"", 0, 0}, {"   ", 0, 3}, {"[", 0, 1}, {"[1,]", 0, 3}, {"[1 2]", 0, 3}, {"[,1]", 0, 1},
        {"{\"a\" 1}", 0, 5}, {"{\"a\":1,}", 0, 7}, {"{1:2}", 0, 1}, {"{\"a\":}", 0, 5}, {"{'a':1}", 0, 1},
        {"01", 0, 0}, {"-01", 0, 0}, {"1.", 0, 2}, {".5", 0, 0}, {"+1", 0, 0}, {"1e", 0, 2}, {"1e+", 0, 3},
        {"-", 0, 1}, {"--1", 0, 1}, {"0x10", 0, 1}, {"1.5.3", 0, 3}, {"tru", 0, 0}, {"nul", 0, 0},
        {"True", 0, 0}, {"truex", 0, 4}, {"\"abc", 0, 0}, {"\"\\x\"", 0, 1}, {"\"\\u12\"", 0, 1},
        {"\"\\u12G4\"", 0, 1}, {"\"\\ud800\"", 0, 1}, {"\"\\udc00\"", 0, 1}, {"\"\\ud800\\u0041\"", 0, 1},
        {"\"\\ud800x\"", 0, 1}, {"\"a\x01\"", 0, 2}, {"\"a\tb\"", 0, 2}, {"\"\xff\"", 0, 1},
        {"\"\xc0\xaf\"", 0, 1}, {"\"\xed\xa0\x80\"", 0, 1}, {"\"\xe2\x82\"", 0, 1}, {"\"\x80\"", 0, 1},
        {"[1] x", 0, 4}, {"{} {}", 0, 3}, {"NaN", 0, 0}, {"Infinity", 0, 0}, {"-Infinity", 0, 1},
        {"1e400", 0, 0}, {"-1e400", 0, 0}, {"{\"a\":1,\"b\":2,\"a\":3}", 0, 17}, {"\xef\xbb\xbf{}", 0, 0},
        {"[1,2]\0", 6, 5}, {"[1\0]", 4, 2}, {"/* c */ 1", 0, 0}, {"[1,2", 0, 4}, {"{\"a\":1", 0, 6},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        attn__json_doc doc;
        size_t len = bad[i].len ? bad[i].len : strlen(bad[i].text);
        attn_status st = attn__json_parse(ctx, bad[i].text, len, NULL, &doc);
        if (st != ATTN_ERR_BAD_FILE) FAIL("case %zu (%s) returned %d", i, bad[i].text, (int)st);
        ASSERT_TRUE(doc.root == NULL);
        char want[32];
        snprintf(want, sizeof want, "at byte %zu:", bad[i].at);
        if (!contains(attn_ctx_last_error(ctx), want))
            FAIL("case %zu (%s): message \"%s\" lacks \"%s\"", i, bad[i].text, attn_ctx_last_error(ctx), want);
        ASSERT_EQ_INT(c.live, 1);
    }
    attn__json_doc doc;
    ASSERT_STATUS(parse_str(ctx, "{\"name\":1,\"name\":2}", &doc), ATTN_ERR_BAD_FILE);
    ASSERT_MSG_HAS(ctx, "duplicate key \"name\"");
    ASSERT_STATUS(parse_str(ctx, "\"\\q\"", &doc), ATTN_ERR_BAD_FILE);
    ASSERT_MSG_HAS(ctx, "invalid escape");
    // `what` names the input.
    attn__json_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.what = "golden.json";
    ASSERT_STATUS(attn__json_parse(ctx, "[1,,2]", 6, &opts, &doc), ATTN_ERR_BAD_FILE);
    ASSERT_MSG_HAS(ctx, "golden.json at byte 3");
    // Argument checks.
    ASSERT_STATUS(attn__json_parse(ctx, "1", 1, NULL, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn__json_parse(ctx, NULL, 3, NULL, &doc), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn__json_parse(NULL, "1", 1, NULL, &doc), ATTN_ERR_INVALID_ARG);
    free_ctx(ctx, &c);
}

static void test_json_limits(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    attn__json_doc doc;
    enum { DEEP = 100000 };
    char *deep = malloc(2 * DEEP + 1);
    // 128 nested arrays parse with the default limit; 129 do not.
    for (int depth = 128; depth <= 129; depth++) {
        for (int i = 0; i < depth; i++) {
            deep[i] = '[';
            deep[depth + i] = ']';
        }
        attn_status st = attn__json_parse(ctx, deep, 2 * (size_t)depth, NULL, &doc);
        ASSERT_STATUS(st, depth == 128 ? ATTN_OK : ATTN_ERR_BAD_FILE);
        attn__json_free(ctx, &doc);
    }
    ASSERT_MSG_HAS(ctx, "deeper than 128");
    // Hostile nesting fails fast at the limit, without deep recursion.
    memset(deep, '[', DEEP);
    ASSERT_STATUS(attn__json_parse(ctx, deep, DEEP, NULL, &doc), ATTN_ERR_BAD_FILE);
    ASSERT_MSG_HAS(ctx, "at byte 128:");
    memset(deep, '{', DEEP);
    ASSERT_STATUS(attn__json_parse(ctx, deep, DEEP, NULL, &doc), ATTN_ERR_BAD_FILE);
    attn__json_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.max_depth = 2;
    ASSERT_STATUS(attn__json_parse(ctx, "[[1]]", 5, &opts, &doc), ATTN_OK);
    attn__json_free(ctx, &doc);
    ASSERT_STATUS(attn__json_parse(ctx, "[[[1]]]", 7, &opts, &doc), ATTN_ERR_BAD_FILE);
    // max_nodes.
    opts.max_depth = 0;
    opts.max_nodes = 3;
    ASSERT_STATUS(attn__json_parse(ctx, "[1,2]", 5, &opts, &doc), ATTN_OK);
    ASSERT_EQ_INT(doc.n_nodes, 3);
    attn__json_free(ctx, &doc);
    ASSERT_STATUS(attn__json_parse(ctx, "[1,2,3]", 7, &opts, &doc), ATTN_ERR_BAD_FILE);
    ASSERT_MSG_HAS(ctx, "more than 3 values");
    // The tree's memory is linear in the input: "[0,0,...,0]", 49999 zeros in 99999 bytes.
    deep[0] = '[';
    for (int i = 1; i < DEEP - 2; i++) deep[i] = (i % 2) ? '0' : ',';
    deep[DEEP - 2] = ']';
    ASSERT_OK(attn__json_parse(ctx, deep, DEEP - 1, NULL, &doc));
    ASSERT_EQ_INT(attn__json_len(doc.root), (DEEP - 2) / 2);
    ASSERT_TRUE(doc.bytes <= 20 * (size_t)DEEP);
    ASSERT_TRUE(c.max_request <= 20 * (size_t)DEEP);
    attn__json_free(ctx, &doc);
    free(deep);
    // Each allocation failure is reported and leaks nothing (the parser allocates once).
    const char *text = "{\"a\": [1, 2, {\"b\": \"c\"}], \"d\": \"e\"}";
    for (long k = 0;; k++) {
        c.fail_at = c.allocs + k;
        attn_status st = parse_str(ctx, text, &doc);
        c.fail_at = -1;
        if (st == ATTN_OK) break;
        ASSERT_STATUS(st, ATTN_ERR_OUT_OF_MEMORY);
        ASSERT_EQ_INT(c.live, 1);
        ASSERT_TRUE(k < 10);
    }
    attn__json_free(ctx, &doc);
    free_ctx(ctx, &c);
}

static void test_json_arrays(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    attn__json_doc doc;
    const char *text = "{\"a\": {\"shape\": [3, 2], \"float32\": [[0.1, -2], [3e-1, 4.5], [true, false]]},"
                       " \"s\": 2.5, \"e\": [], \"e2\": [[], []], \"rag\": [[1, 2], [3]], \"rag2\": [[1], 2],"
                       " \"str\": [1, \"x\"], \"deep\": [[[[[[[[[1]]]]]]]]], \"ok8\": [[[[[[[[1, 2]]]]]]]]}";
    ASSERT_OK(parse_str(ctx, text, &doc));
    const attn__json *a = attn__json_get(doc.root, "a");
    int64_t shape[ATTN_MAX_DIMS];
    int ndim = -1;
    float *x = NULL;
    ASSERT_OK(attn__json_to_f32(ctx, attn__json_get(a, "float32"), "a.float32", shape, &ndim, &x));
    ASSERT_EQ_INT(ndim, 2);
    ASSERT_EQ_INT(shape[0], 3);
    ASSERT_EQ_INT(shape[1], 2);
    const float want[6] = {0.1f, -2.0f, 0.3f, 4.5f, 1.0f, 0.0f};
    ASSERT_BITS_EQ(x, want, 6);
    attn__free(ctx, x);
    double *y = NULL;
    ASSERT_OK(attn__json_to_f64(ctx, attn__json_get(a, "float32"), "a.float32", shape, &ndim, &y));
    ASSERT_TRUE(y[0] == 0.1 && y[2] == 0.3);
    attn__free(ctx, y);
    // Caller-provided buffers.
    float buf[6];
    ASSERT_OK(attn__json_flatten_f32(ctx, attn__json_get(a, "float32"), "a", buf, 6));
    ASSERT_BITS_EQ(buf, want, 6);
    ASSERT_STATUS(attn__json_flatten_f32(ctx, attn__json_get(a, "float32"), "a", buf, 5), ATTN_ERR_BAD_SHAPE);
    double dbuf[1];
    ASSERT_OK(attn__json_flatten_f64(ctx, attn__json_get(doc.root, "s"), "s", dbuf, 1));
    ASSERT_TRUE(dbuf[0] == 2.5);
    // Shapes: scalar, empty, empty rows, 8 dimensions.
    int64_t numel = -1;
    ASSERT_OK(attn__json_shape(ctx, attn__json_get(doc.root, "s"), "s", ATTN_MAX_DIMS, shape, &ndim, &numel));
    ASSERT_TRUE(ndim == 0 && numel == 1);
    ASSERT_OK(attn__json_shape(ctx, attn__json_get(doc.root, "e"), "e", ATTN_MAX_DIMS, shape, &ndim, &numel));
    ASSERT_TRUE(ndim == 1 && shape[0] == 0 && numel == 0);
    ASSERT_OK(attn__json_to_f32(ctx, attn__json_get(doc.root, "e2"), "e2", shape, &ndim, &x));
    ASSERT_TRUE(ndim == 2 && shape[0] == 2 && shape[1] == 0 && x != NULL);
    attn__free(ctx, x);
    ASSERT_OK(attn__json_shape(ctx, attn__json_get(doc.root, "ok8"), "ok8", ATTN_MAX_DIMS, shape, &ndim, &numel));
    ASSERT_TRUE(ndim == 8 && shape[7] == 2 && numel == 2);
    ASSERT_OK(attn__json_shape(ctx, attn__json_get(a, "shape"), "a.shape", 1, shape, &ndim, &numel));
    ASSERT_TRUE(ndim == 1 && shape[0] == 2);
    // Errors.
    ASSERT_STATUS(attn__json_to_f32(ctx, attn__json_get(doc.root, "rag"), "rag", shape, &ndim, &x), ATTN_ERR_BAD_FILE);
    ASSERT_TRUE(x == NULL);
    ASSERT_MSG_HAS(ctx, "rag: ragged array");
    ASSERT_STATUS(attn__json_to_f32(ctx, attn__json_get(doc.root, "rag2"), "rag2", shape, &ndim, &x),
                  ATTN_ERR_BAD_FILE);
    ASSERT_STATUS(attn__json_to_f32(ctx, attn__json_get(doc.root, "str"), "str", shape, &ndim, &x), ATTN_ERR_BAD_FILE);
    ASSERT_MSG_HAS(ctx, "expected a number");
    ASSERT_STATUS(attn__json_to_f32(ctx, attn__json_get(doc.root, "deep"), "deep", shape, &ndim, &x),
                  ATTN_ERR_BAD_FILE);
    ASSERT_MSG_HAS(ctx, "more than 8 dimensions");
    ASSERT_STATUS(attn__json_to_f32(ctx, attn__json_get(doc.root, "nope"), "nope", shape, &ndim, &x),
                  ATTN_ERR_NOT_FOUND);
    ASSERT_STATUS(attn__json_to_f32(ctx, a, "a", shape, &ndim, &x), ATTN_ERR_BAD_FILE); // an object
    ASSERT_STATUS(attn__json_to_f32(ctx, a, "a", shape, &ndim, NULL), ATTN_ERR_INVALID_ARG);
    // Allocation failure in to_f32.
    c.fail_at = c.allocs;
    ASSERT_STATUS(attn__json_to_f32(ctx, attn__json_get(a, "float32"), "a", shape, &ndim, &x),
                  ATTN_ERR_OUT_OF_MEMORY);
    ASSERT_TRUE(x == NULL);
    c.fail_at = -1;
    attn__json_free(ctx, &doc);
    free_ctx(ctx, &c);
}

// A golden-style file: {"name": {"shape": [...], "float32": nested arrays}}.
static void test_json_file(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    make_tmp_dir();
    const char *text = "{\"q\": {\"shape\": [2, 3], \"float32\": [[0.5, 1, -1.25], [1e-3, 2E2, 0]]},\n"
                       " \"lse\": {\"shape\": [2], \"float32\": [-Infinity, 0.75]},\n"
                       " \"bits\": [[\"0x3f800000\", \"0xBF000000\"], [\"0x7fc00001\", \"0x00000001\"]],\n"
                       " \"badbits\": [\"0x3f80000\", \"0x3f80000g\"]}\n";
    spit(in_tmp("golden.json"), text, strlen(text));
    attn__json_doc doc;
    ASSERT_STATUS(attn__json_parse_file(ctx, in_tmp("golden.json"), 1 << 20, NULL, &doc), ATTN_ERR_BAD_FILE);
    ASSERT_MSG_HAS(ctx, "golden.json at byte");
    attn__json_opts opts;
    memset(&opts, 0, sizeof opts);
    opts.allow_nonfinite = true;
    for (long k = 0;; k++) { // each allocation failure, then success
        c.fail_at = c.allocs + k;
        attn_status st = attn__json_parse_file(ctx, in_tmp("golden.json"), 1 << 20, &opts, &doc);
        c.fail_at = -1;
        if (st == ATTN_OK) break;
        ASSERT_STATUS(st, ATTN_ERR_OUT_OF_MEMORY);
        ASSERT_EQ_INT(c.live, 1);
    }
    const attn__json *q = attn__json_get(doc.root, "q");
    int64_t shape[ATTN_MAX_DIMS], want_shape[2];
    int ndim;
    float *x;
    ASSERT_OK(attn__json_to_f32(ctx, attn__json_get(q, "float32"), "q", shape, &ndim, &x));
    ASSERT_TRUE(attn__json_int64(attn__json_at(attn__json_get(q, "shape"), 0), &want_shape[0]));
    ASSERT_TRUE(attn__json_int64(attn__json_at(attn__json_get(q, "shape"), 1), &want_shape[1]));
    ASSERT_TRUE(ndim == 2 && shape[0] == want_shape[0] && shape[1] == want_shape[1]);
    const float want[6] = {0.5f, 1.0f, -1.25f, 1e-3f, 200.0f, 0.0f};
    ASSERT_BITS_EQ(x, want, 6);
    attn__free(ctx, x);
    ASSERT_OK(attn__json_to_f32(ctx, attn__json_get(attn__json_get(doc.root, "lse"), "float32"), "lse", shape, &ndim,
                                &x));
    ASSERT_TRUE(x[0] == -INFINITY && x[1] == 0.75f);
    attn__free(ctx, x);
    // float32 bit patterns as strings, exactly (NaN payload and subnormal included).
    ASSERT_OK(attn__json_to_f32(ctx, attn__json_get(doc.root, "bits"), "bits", shape, &ndim, &x));
    ASSERT_TRUE(ndim == 2 && shape[0] == 2 && shape[1] == 2);
    const uint32_t want_bits[4] = {0x3f800000u, 0xbf000000u, 0x7fc00001u, 0x00000001u};
    for (int i = 0; i < 4; i++) ASSERT_EQ_U64(harness_f32_bits(x[i]), want_bits[i]);
    attn__free(ctx, x);
    double *xd;
    ASSERT_OK(attn__json_to_f64(ctx, attn__json_get(doc.root, "bits"), "bits", shape, &ndim, &xd));
    ASSERT_TRUE(xd[0] == 1.0 && xd[1] == -0.5 && isnan(xd[2]) && xd[3] == 0x1p-149);
    attn__free(ctx, xd);
    ASSERT_STATUS(attn__json_to_f32(ctx, attn__json_get(doc.root, "badbits"), "badbits", shape, &ndim, &x),
                  ATTN_ERR_BAD_FILE);
    attn__json_free(ctx, &doc);
    ASSERT_STATUS(attn__json_parse_file(ctx, in_tmp("golden.json"), 10, &opts, &doc), ATTN_ERR_IO);
    ASSERT_STATUS(attn__json_parse_file(ctx, in_tmp("none.json"), 1 << 20, &opts, &doc), ATTN_ERR_IO);
    ASSERT_TRUE(doc.root == NULL);
    remove_tmp_dir();
    free_ctx(ctx, &c);
}

// ================================================================================================
// file helpers
// ================================================================================================

static void test_file_read_all(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    make_tmp_dir();
    void *data = NULL;
    size_t size = 0;
    ASSERT_OK(attn__file_read_all(ctx, FIXTURE("f32_2x3.npy"), 1 << 20, &data, &size));
    bytes ref = slurp(FIXTURE("f32_2x3.npy"));
    ASSERT_TRUE(size == ref.n && memcmp(data, ref.p, size) == 0 && ((char *)data)[size] == '\0');
    attn__free(ctx, data);
    // Over the limit: refused before allocating a buffer for it.
    c.max_request = 0;
    ASSERT_STATUS(attn__file_read_all(ctx, FIXTURE("f32_2x3.npy"), ref.n - 1, &data, &size), ATTN_ERR_IO);
    ASSERT_TRUE(data == NULL && c.max_request == 0);
    ASSERT_MSG_HAS(ctx, "more than the limit");
    ASSERT_OK(attn__file_read_all(ctx, FIXTURE("f32_2x3.npy"), ref.n, &data, &size));
    attn__free(ctx, data);
    free(ref.p);
    // Empty file.
    spit(in_tmp("empty"), "", 0);
    ASSERT_OK(attn__file_read_all(ctx, in_tmp("empty"), 10, &data, &size));
    ASSERT_TRUE(size == 0 && ((char *)data)[0] == '\0');
    attn__free(ctx, data);
    // Missing file, directory, FIFO (refused without blocking).
    ASSERT_STATUS(attn__file_read_all(ctx, in_tmp("missing"), 10, &data, &size), ATTN_ERR_IO);
    ASSERT_MSG_HAS(ctx, "missing");
    ASSERT_MSG_HAS(ctx, strerror(ENOENT));
    ASSERT_STATUS(attn__file_read_all(ctx, tmp_dir, 10, &data, &size), ATTN_ERR_IO);
    ASSERT_MSG_HAS(ctx, "not a regular file");
    ASSERT_TRUE(mkfifo(in_tmp("fifo"), 0600) == 0);
    ASSERT_STATUS(attn__file_read_all(ctx, in_tmp("fifo"), 10, &data, &size), ATTN_ERR_IO);
    ASSERT_STATUS(attn__file_read_all(ctx, NULL, 10, &data, &size), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn__file_read_all(ctx, "", 10, &data, &size), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn__file_read_all(ctx, "x", 10, NULL, &size), ATTN_ERR_INVALID_ARG);
    // Allocation failure.
    c.fail_at = c.allocs;
    ASSERT_STATUS(attn__file_read_all(ctx, FIXTURE("f32_2x3.npy"), 1 << 20, &data, &size), ATTN_ERR_OUT_OF_MEMORY);
    c.fail_at = -1;
    remove_tmp_dir();
    free_ctx(ctx, &c);
}

static void test_file_atomic_write(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    make_tmp_dir();
    const char *p = in_tmp("out.bin");
    ASSERT_OK(attn__file_write_atomic(ctx, p, "first", 5));
    ASSERT_OK(attn__file_write_atomic(ctx, p, "second!", 7)); // over an existing file
    bytes b = slurp(p);
    ASSERT_TRUE(b.n == 7 && memcmp(b.p, "second!", 7) == 0);
    free(b.p);
    ASSERT_EQ_INT(count_entries(tmp_dir), 1);
    // Permissions follow the umask like any new file (not the temporary file's defaults).
    mode_t um = umask(022);
    umask(um);
    struct stat st;
    ASSERT_TRUE(stat(p, &st) == 0);
    ASSERT_EQ_INT(st.st_mode & 0777, 0666 & ~um);
    // Step by step, then abort: nothing is left and the target is unchanged.
    attn__atomic_file w;
    ASSERT_OK(attn__atomic_begin(ctx, p, &w));
    ASSERT_EQ_INT(count_entries(tmp_dir), 2);
    ASSERT_OK(attn__atomic_write(ctx, &w, "zzz", 3));
    attn__atomic_abort(ctx, &w);
    attn__atomic_abort(ctx, &w); // twice is harmless
    ASSERT_EQ_INT(count_entries(tmp_dir), 1);
    b = slurp(p);
    ASSERT_TRUE(b.n == 7 && memcmp(b.p, "second!", 7) == 0);
    free(b.p);
    // Failures.
    ASSERT_STATUS(attn__file_write_atomic(ctx, in_tmp("no/such/dir/x"), "a", 1), ATTN_ERR_IO);
    ASSERT_MSG_HAS(ctx, strerror(ENOENT));
    ASSERT_STATUS(attn__file_write_atomic(ctx, in_tmp("dir/"), "a", 1), ATTN_ERR_INVALID_ARG);
    ASSERT_TRUE(mkdir(in_tmp("sub"), 0700) == 0);
    ASSERT_STATUS(attn__file_write_atomic(ctx, in_tmp("sub"), "a", 1), ATTN_ERR_IO); // rename onto a directory
    ASSERT_MSG_HAS(ctx, "rename");
    ASSERT_EQ_INT(count_entries(tmp_dir), 2);
    ASSERT_EQ_INT(count_entries(in_tmp("sub")), 0);
    ASSERT_STATUS(attn__file_write_atomic(ctx, NULL, "a", 1), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn__atomic_write(ctx, &w, "a", 1), ATTN_ERR_INVALID_ARG); // not open
    ASSERT_STATUS(attn__atomic_commit(ctx, &w), ATTN_ERR_INVALID_ARG);
    remove_tmp_dir();
    free_ctx(ctx, &c);
}

// ================================================================================================
// .npy
// ================================================================================================

static void test_npy_fixtures(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    for (int i = 0; i < N_NPY_FIXTURES; i++) {
        attn_tensor t;
        ASSERT_OK(attn_npy_read(ctx, npy_fixtures[i].file, &t));
        ASSERT_TRUE(t.name == NULL && t.data != NULL);
        npy_fixtures[i].check(&t);
        attn_tensor_release(ctx, &t);
        ASSERT_TRUE(t.data == NULL);
        // The same from memory.
        bytes b = slurp(npy_fixtures[i].file);
        ASSERT_OK(attn_npy_parse(ctx, b.p, b.n, &t));
        npy_fixtures[i].check(&t);
        attn_tensor_release(ctx, &t);
        free(b.p);
    }
    // Format versions 2.0 and 3.0.
    const char *versions[] = {FIXTURE("f32_2x3_v2.npy"), FIXTURE("f32_2x3_v3.npy")};
    for (int i = 0; i < 2; i++) {
        attn_tensor t;
        bytes b = slurp(versions[i]);
        ASSERT_EQ_INT(b.p[6], i + 2);
        free(b.p);
        ASSERT_OK(attn_npy_read(ctx, versions[i], &t));
        check_f32_2x3(&t);
        attn_tensor_release(ctx, &t);
    }
    // Valid files that are not supported: named in the message.
    static const struct {
        const char *file, *needle;
    } unsupported[] = {
        {FIXTURE("fortran_f32_2x3.npy"), "fortran_order"},
        {FIXTURE("bigendian_f32_4.npy"), "big-endian dtype '>f4'"},
        {FIXTURE("i8_4.npy"), "'|i1'"},
        {FIXTURE("u16_4.npy"), "'<u2'"},
    };
    for (int i = 0; i < 4; i++) {
        attn_tensor t;
        ASSERT_STATUS(attn_npy_read(ctx, unsupported[i].file, &t), ATTN_ERR_UNSUPPORTED);
        ASSERT_MSG_HAS(ctx, unsupported[i].needle);
        ASSERT_TRUE(t.data == NULL);
    }
    free_ctx(ctx, &c);
}

// Writing what numpy wrote gives numpy's bytes exactly.
static void test_npy_write_matches_numpy(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    make_tmp_dir();
    for (int i = 0; i < N_NPY_FIXTURES; i++) {
        attn_tensor t;
        ASSERT_OK(attn_npy_read(ctx, npy_fixtures[i].file, &t));
        const char *out = in_tmp("w.npy");
        ASSERT_OK(attn_npy_write(ctx, out, t.dtype, t.ndim, t.shape, t.data));
        bytes want = slurp(npy_fixtures[i].file), got = slurp(out);
        if (!same_bytes(want, got)) FAIL("%s: written bytes differ from numpy's", npy_fixtures[i].file);
        harness_checks++;
        ASSERT_EQ_INT(got.n % 64, (int)(attn_tensor_numel(&t) * (int64_t)attn_dtype_size(t.dtype)) % 64);
        free(want.p);
        free(got.p);
        attn_tensor_release(ctx, &t);
    }
    ASSERT_EQ_INT(count_entries(tmp_dir), 1);
    remove_tmp_dir();
    free_ctx(ctx, &c);
}

// Fills n elements of `dtype` with a pattern that covers each type's range.
static void fill_pattern(attn_dtype dtype, void *data, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        switch (dtype) {
        case ATTN_DTYPE_F32: ((float *)data)[i] = (float)i * -1.25f + 0.1f; break;
        case ATTN_DTYPE_F64: ((double *)data)[i] = (double)i * 1e300 - 0.3; break;
        case ATTN_DTYPE_F16:
        case ATTN_DTYPE_BF16: ((uint16_t *)data)[i] = (uint16_t)(i * 7919); break;
        case ATTN_DTYPE_BOOL: ((uint8_t *)data)[i] = (uint8_t)(i % 2); break;
        case ATTN_DTYPE_U8: ((uint8_t *)data)[i] = (uint8_t)(i * 37); break;
        case ATTN_DTYPE_I32: ((int32_t *)data)[i] = (int32_t)(uint32_t)((uint64_t)i * 2654435761u); break;
        case ATTN_DTYPE_I64: ((int64_t *)data)[i] = (i % 2 ? INT64_MIN : INT64_MAX) + (i % 2 ? i : -i); break;
        case ATTN_DTYPE_Q8_0: // block types: not tensor-file dtypes
        case ATTN_DTYPE_Q4_0: break;
        }
    }
}

static const attn_dtype all_dtypes[] = {ATTN_DTYPE_F32, ATTN_DTYPE_F64, ATTN_DTYPE_F16, ATTN_DTYPE_BF16,
                                        ATTN_DTYPE_BOOL, ATTN_DTYPE_U8,  ATTN_DTYPE_I32, ATTN_DTYPE_I64};

static void test_npy_roundtrip(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    make_tmp_dir();
    static const struct {
        int ndim;
        int64_t shape[ATTN_MAX_DIMS];
    } shapes[] = {{0, {0}}, {1, {1}}, {1, {17}}, {2, {3, 5}}, {3, {2, 3, 4}}, {2, {0, 4}},
                  {8, {1, 2, 1, 2, 1, 2, 1, 3}}, {1, {100000}}};
    unsigned char *buf = malloc(800000);
    for (size_t di = 0; di < sizeof all_dtypes / sizeof all_dtypes[0]; di++) {
        attn_dtype dt = all_dtypes[di];
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            attn_tensor want;
            memset(&want, 0, sizeof want);
            want.dtype = dt;
            want.ndim = shapes[si].ndim;
            memcpy(want.shape, shapes[si].shape, sizeof want.shape);
            int64_t n = attn_tensor_numel(&want);
            fill_pattern(dt, buf, n);
            const char *p = in_tmp("rt.npy");
            attn_status st = attn_npy_write(ctx, p, dt, want.ndim, want.shape, buf);
            if (dt == ATTN_DTYPE_BF16) { // .npy has no bfloat16
                ASSERT_STATUS(st, ATTN_ERR_UNSUPPORTED);
                continue;
            }
            ASSERT_OK(st);
            attn_tensor t;
            ASSERT_OK(attn_npy_read(ctx, p, &t));
            ASSERT_EQ_INT(t.dtype, dt);
            ASSERT_EQ_INT(t.ndim, want.ndim);
            for (int d = 0; d < t.ndim; d++) ASSERT_EQ_INT(t.shape[d], want.shape[d]);
            ASSERT_TRUE(memcmp(t.data, buf, (size_t)n * attn_dtype_size(dt)) == 0);
            attn_tensor_release(ctx, &t);
        }
    }
    free(buf);
    ASSERT_EQ_INT(count_entries(tmp_dir), 1);
    // Argument checks (nothing is written).
    const char *p = in_tmp("args.npy");
    float one = 1;
    int64_t shp[2] = {1, 1};
    ASSERT_STATUS(attn_npy_write(NULL, p, ATTN_DTYPE_F32, 0, NULL, &one), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_npy_write(ctx, NULL, ATTN_DTYPE_F32, 0, NULL, &one), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_npy_write(ctx, "", ATTN_DTYPE_F32, 0, NULL, &one), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_npy_write(ctx, p, (attn_dtype)99, 0, NULL, &one), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_npy_write(ctx, p, ATTN_DTYPE_F32, -1, shp, &one), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_npy_write(ctx, p, ATTN_DTYPE_F32, ATTN_MAX_DIMS + 1, shp, &one), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_npy_write(ctx, p, ATTN_DTYPE_F32, 2, NULL, &one), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_npy_write(ctx, p, ATTN_DTYPE_F32, 2, shp, NULL), ATTN_ERR_INVALID_ARG);
    int64_t neg[2] = {2, -1}, huge[2] = {INT64_C(1) << 40, INT64_C(1) << 40};
    ASSERT_STATUS(attn_npy_write(ctx, p, ATTN_DTYPE_F32, 2, neg, &one), ATTN_ERR_BAD_SHAPE);
    ASSERT_STATUS(attn_npy_write(ctx, p, ATTN_DTYPE_F32, 2, huge, &one), ATTN_ERR_OVERFLOW);
    int64_t empty[1] = {0};
    ASSERT_OK(attn_npy_write(ctx, p, ATTN_DTYPE_F32, 1, empty, NULL)); // no data needed for 0 elements
    attn_tensor t;
    ASSERT_STATUS(attn_npy_read(NULL, p, &t), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_npy_read(ctx, NULL, &t), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_npy_read(ctx, p, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_npy_parse(ctx, NULL, 10, &t), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_npy_parse(ctx, "x", 1, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_npy_parse(NULL, "x", 1, &t), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_npy_read(ctx, in_tmp("missing.npy"), &t), ATTN_ERR_IO);
    ASSERT_MSG_HAS(ctx, "missing.npy");
    ASSERT_STATUS(attn_npy_read(ctx, tmp_dir, &t), ATTN_ERR_IO);
    remove_tmp_dir();
    free_ctx(ctx, &c);
}

// Every proper prefix of a valid file fails cleanly, in memory and on disk; so does an extra byte.
static void test_npy_truncated(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    make_tmp_dir();
    const char *files[] = {FIXTURE("f32_2x3.npy"), FIXTURE("scalar_f32.npy"), FIXTURE("f32_2x3_v2.npy"),
                           FIXTURE("empty_f32_0x3.npy")};
    for (int f = 0; f < 4; f++) {
        bytes b = slurp(files[f]);
        for (size_t len = 0; len < b.n; len++) {
            attn_tensor t;
            attn_status st = attn_npy_parse(ctx, len ? b.p : NULL, len, &t);
            if (st != ATTN_ERR_BAD_FILE) FAIL("%s cut to %zu bytes: status %d (%s)", files[f], len, (int)st,
                                              attn_ctx_last_error(ctx));
            ASSERT_TRUE(t.data == NULL);
            ASSERT_EQ_INT(c.live, 1);
            spit(in_tmp("cut.npy"), b.p, len);
            ASSERT_STATUS(attn_npy_read(ctx, in_tmp("cut.npy"), &t), ATTN_ERR_BAD_FILE);
            ASSERT_EQ_INT(c.live, 1);
        }
        unsigned char *longer = malloc(b.n + 1);
        memcpy(longer, b.p, b.n);
        longer[b.n] = 0;
        attn_tensor t;
        ASSERT_STATUS(attn_npy_parse(ctx, longer, b.n + 1, &t), ATTN_ERR_BAD_FILE);
        ASSERT_MSG_HAS(ctx, "the file has");
        free(longer);
        free(b.p);
    }
    ASSERT_STATUS(attn_npy_read(ctx, in_tmp("cut.npy"), &(attn_tensor){0}), ATTN_ERR_BAD_FILE);
    ASSERT_MSG_HAS(ctx, "cut.npy"); // format errors name the file
    remove_tmp_dir();
    free_ctx(ctx, &c);
}

// Builds a version-1.0 (or 2.0) .npy with header text `dict` and `data_len` zero bytes.
static bytes make_npy(const char *dict, size_t data_len, int major) {
    size_t pre = major == 1 ? 10 : 12, hl = strlen(dict);
    bytes b;
    b.n = pre + hl + data_len;
    b.p = calloc(1, b.n + 1);
    memcpy(b.p, "\x93NUMPY", 6);
    b.p[6] = (unsigned char)major;
    b.p[7] = 0;
    for (size_t i = 0; i < pre - 8; i++) b.p[8 + i] = (unsigned char)(hl >> (8 * i));
    memcpy(b.p + pre, dict, hl);
    return b;
}

static void test_npy_lying_headers(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    static const struct {
        const char *dict;
        size_t data_len;
        attn_status want;
        const char *needle;
    } cases[] = {
        // Fine variations of the dict syntax.
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 24, ATTN_OK, ""},
        {"{\"shape\":(2,3),\"descr\":\"<f4\",\"fortran_order\":False}", 24, ATTN_OK, ""},
        {" { 'descr' : '<f4' , 'fortran_order' : False , 'shape' : ( 2 , 3 , ) }  \t\n", 24, ATTN_OK, ""},
        {"{'descr': '|u1', 'fortran_order': False, 'shape': (0,), }", 0, ATTN_OK, ""},
        // The shape lies about the data.
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 3), }", 24, ATTN_ERR_BAD_FILE, "need 36 data bytes"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 24, ATTN_ERR_BAD_FILE, "need 16"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }", 16,
         ATTN_ERR_BAD_FILE, "2^63"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2147483648, 2147483648), }", 16, ATTN_ERR_BAD_FILE,
         "size_t"},
        {"{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776,), }", 16, ATTN_ERR_BAD_FILE, "need"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 16, ATTN_ERR_BAD_FILE,
         "int64"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4, ATTN_ERR_UNSUPPORTED,
         "9 dimensions"},
        // Malformed dicts.
        {"", 0, ATTN_ERR_BAD_FILE, "expected '{'"},
        {"{'descr': '<f4', 'fortran_order': False}", 4, ATTN_ERR_BAD_FILE, "lacks the key 'shape'"},
        {"{'descr': '<f4', 'shape': ()}", 4, ATTN_ERR_BAD_FILE, "fortran_order"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}", 4, ATTN_ERR_BAD_FILE, "duplicate"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (), 'extra': 1}", 4, ATTN_ERR_BAD_FILE, "unexpected key"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (3)}", 12, ATTN_ERR_BAD_FILE, "not a tuple"},
        {"{'descr': '<f4', 'fortran_order': false, 'shape': ()}", 4, ATTN_ERR_BAD_FILE, "True or False"},
        {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': ()}", 4, ATTN_ERR_BAD_FILE, "True or False"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", 4, ATTN_ERR_BAD_FILE, "non-negative"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (01,)}", 4, ATTN_ERR_BAD_FILE, "leading zero"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': [1]}", 4, ATTN_ERR_BAD_FILE, "expected '('"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x", 4, ATTN_ERR_BAD_FILE, "after the header"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", 4, ATTN_ERR_BAD_FILE, "expected ','"},
        {"{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}", 4, ATTN_ERR_BAD_FILE, ""},
        {"{'descr': '<f\\x34', 'fortran_order': False, 'shape': (1,)}", 4, ATTN_ERR_BAD_FILE, "escapes"},
        {"{'descr': 4, 'fortran_order': False, 'shape': (1,)}", 4, ATTN_ERR_BAD_FILE, "quoted string"},
        {"{descr: '<f4', 'fortran_order': False, 'shape': (1,)}", 4, ATTN_ERR_BAD_FILE, "quoted string"},
        {"{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}", 4, ATTN_ERR_BAD_FILE, "expected ','"},
        // Valid headers of unsupported arrays.
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16, ATTN_ERR_UNSUPPORTED, "fortran"},
        {"{'descr': '>i8', 'fortran_order': False, 'shape': (2,), }", 16, ATTN_ERR_UNSUPPORTED, "big-endian"},
        {"{'descr': '|i1', 'fortran_order': False, 'shape': (2,), }", 2, ATTN_ERR_UNSUPPORTED, "'|i1'"},
        {"{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16, ATTN_ERR_UNSUPPORTED, "'<c8'"},
        {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8, ATTN_ERR_UNSUPPORTED,
         "structured"},
        {"{'descr': '<U100000000000000000000000000000000000000000000000000000000000000000', 'fortran_order': False, "
         "'shape': (2,), }", 8, ATTN_ERR_UNSUPPORTED, "..."},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bytes b = make_npy(cases[i].dict, cases[i].data_len, 1);
        attn_tensor t;
        c.max_request = 0;
        attn_status st = attn_npy_parse(ctx, b.p, b.n, &t);
        if (st != cases[i].want)
            FAIL("case %zu: status %d (%s), expected %d", i, (int)st, attn_ctx_last_error(ctx), (int)cases[i].want);
        if (st == ATTN_OK) {
            attn_tensor_release(ctx, &t);
        } else {
            ASSERT_MSG_HAS(ctx, cases[i].needle);
            ASSERT_TRUE(t.data == NULL);
        }
        ASSERT_TRUE(c.max_request <= 1024); // never an allocation sized by the lying header
        ASSERT_EQ_INT(c.live, 1);
        // Version 2.0 with the same dict behaves the same.
        free(b.p);
        b = make_npy(cases[i].dict, cases[i].data_len, 2);
        ASSERT_STATUS(attn_npy_parse(ctx, b.p, b.n, &t), cases[i].want);
        attn_tensor_release(ctx, &t);
        free(b.p);
    }
    // The prologue.
    bytes b = make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4, 1);
    attn_tensor t;
    ASSERT_OK(attn_npy_parse(ctx, b.p, b.n, &t));
    attn_tensor_release(ctx, &t);
    b.p[0] = 0x92;
    ASSERT_STATUS(attn_npy_parse(ctx, b.p, b.n, &t), ATTN_ERR_BAD_FILE);
    ASSERT_MSG_HAS(ctx, "magic");
    ASSERT_STATUS(attn_npy_parse(ctx, b.p, 3, &t), ATTN_ERR_BAD_FILE);
    b.p[0] = 0x93;
    b.p[6] = 4;
    ASSERT_STATUS(attn_npy_parse(ctx, b.p, b.n, &t), ATTN_ERR_UNSUPPORTED);
    ASSERT_MSG_HAS(ctx, "version 4.0");
    b.p[6] = 1;
    b.p[7] = 1;
    ASSERT_STATUS(attn_npy_parse(ctx, b.p, b.n, &t), ATTN_ERR_UNSUPPORTED);
    b.p[7] = 0;
    b.p[8] = 0xFF; // header length beyond the file
    b.p[9] = 0xFF;
    ASSERT_STATUS(attn_npy_parse(ctx, b.p, b.n, &t), ATTN_ERR_BAD_FILE);
    ASSERT_MSG_HAS(ctx, "past the end");
    free(b.p);
    // Version 2.0 with a 4 GiB header length, then with an absurd one that fits in the file.
    b = make_npy("{}", 0, 2);
    memset(b.p + 8, 0xFF, 4);
    c.max_request = 0;
    ASSERT_STATUS(attn_npy_parse(ctx, b.p, b.n, &t), ATTN_ERR_BAD_FILE);
    ASSERT_TRUE(c.max_request == 0);
    free(b.p);
    b.n = 12 + 100000;
    b.p = calloc(1, b.n);
    memcpy(b.p, "\x93NUMPY\x02\x00", 8);
    b.p[8] = 100000 & 0xFF;
    b.p[9] = (100000 >> 8) & 0xFF;
    b.p[10] = 100000 >> 16;
    ASSERT_STATUS(attn_npy_parse(ctx, b.p, b.n, &t), ATTN_ERR_BAD_FILE);
    ASSERT_MSG_HAS(ctx, "absurd");
    ASSERT_TRUE(c.max_request == 0);
    free(b.p);
    free_ctx(ctx, &c);
}

// ================================================================================================
// .safetensors
// ================================================================================================

static void check_multi(const attn_tensor_list *l) {
    // Data order (not the JSON key order).
    static const char *order[] = {"h.i64", "b.f64", "a.f32", "g.i32", "c.f16",
                                  "d.bf16", "e.bool", "f.u8", "j.empty", "i.scalar"};
    ASSERT_EQ_INT(l->count, 10);
    for (int i = 0; i < 10; i++)
        if (strcmp(l->tensors[i].name, order[i]) != 0)
            FAIL("tensor %d is %s, expected %s", i, l->tensors[i].name, order[i]);
    check_i64_2x2(attn_tensor_list_find(l, "h.i64"));
    check_f64_5(attn_tensor_list_find(l, "b.f64"));
    check_f32_2x3(attn_tensor_list_find(l, "a.f32"));
    check_i32_3(attn_tensor_list_find(l, "g.i32"));
    check_f16_2x3x4(attn_tensor_list_find(l, "c.f16"));
    const attn_tensor *bf = attn_tensor_list_find(l, "d.bf16");
    ASSERT_EQ_INT(bf->dtype, ATTN_DTYPE_BF16);
    const uint16_t *bits = bf->data;
    ASSERT_TRUE(bits[0] == 0x3F80 && bits[1] == 0xC000 && bits[2] == 0x3F00 && bits[3] == 0x4040);
    check_bool_7(attn_tensor_list_find(l, "e.bool"));
    check_u8_2x2(attn_tensor_list_find(l, "f.u8"));
    check_empty_f32_0x3(attn_tensor_list_find(l, "j.empty"));
    check_scalar_f32(attn_tensor_list_find(l, "i.scalar"));
    ASSERT_TRUE(attn_tensor_list_find(l, "__metadata__") == NULL);
}

static void test_safetensors_fixtures(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    attn_tensor_list l;
    ASSERT_OK(attn_safetensors_read(ctx, FIXTURE("multi.safetensors"), &l));
    check_multi(&l);
    attn_tensor_list_release(ctx, &l);
    ASSERT_TRUE(l.count == 0 && l.tensors == NULL);
    bytes b = slurp(FIXTURE("multi.safetensors"));
    ASSERT_OK(attn_safetensors_parse(ctx, b.p, b.n, &l));
    check_multi(&l);
    attn_tensor_list_release(ctx, &l);
    free(b.p);
    ASSERT_OK(attn_safetensors_read(ctx, FIXTURE("empty.safetensors"), &l));
    ASSERT_EQ_INT(l.count, 0);
    attn_tensor_list_release(ctx, &l);
    ASSERT_OK(attn_safetensors_read(ctx, FIXTURE("py_order.safetensors"), &l));
    ASSERT_EQ_INT(l.count, 7);
    ASSERT_TRUE(strcmp(l.tensors[0].name, "w") == 0 && strcmp(l.tensors[6].name, "name \"quoted\"\n\xc3\xa9") == 0);
    check_f32_2x3(&l.tensors[0]);
    attn_tensor_list_release(ctx, &l);
    free_ctx(ctx, &c);
}

// Writing what the Python writer wrote gives its bytes exactly (same layout rules).
static void test_safetensors_write_matches_python(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    make_tmp_dir();
    attn_tensor_list l;
    ASSERT_OK(attn_safetensors_read(ctx, FIXTURE("py_order.safetensors"), &l));
    ASSERT_OK(attn_safetensors_write(ctx, in_tmp("w.safetensors"), l.tensors, l.count));
    bytes want = slurp(FIXTURE("py_order.safetensors")), got = slurp(in_tmp("w.safetensors"));
    ASSERT_TRUE(same_bytes(want, got));
    free(want.p);
    free(got.p);
    attn_tensor_list_release(ctx, &l);
    ASSERT_OK(attn_safetensors_write(ctx, in_tmp("e.safetensors"), NULL, 0));
    want = slurp(FIXTURE("empty.safetensors"));
    got = slurp(in_tmp("e.safetensors"));
    ASSERT_TRUE(same_bytes(want, got));
    free(want.p);
    free(got.p);
    remove_tmp_dir();
    free_ctx(ctx, &c);
}

static void test_safetensors_roundtrip(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    make_tmp_dir();
    // Every dtype, with shapes of 0, 1, 3 and 8 dimensions and an empty tensor; odd sizes so that
    // later tensors start at unaligned offsets.
    enum { N = 12 };
    attn_tensor ts[N];
    memset(ts, 0, sizeof ts);
    char names[N][16];
    for (int i = 0; i < N; i++) {
        attn_tensor *t = &ts[i];
        snprintf(names[i], sizeof names[i], "t%02d.%s", i, attn_dtype_name(all_dtypes[i % 8]));
        t->name = names[i];
        t->dtype = all_dtypes[i % 8];
        t->ndim = i % 4 == 0 ? 0 : i % 4 == 1 ? 1 : i % 4 == 2 ? 3 : 8;
        for (int d = 0; d < t->ndim; d++) t->shape[d] = 1 + (i + d) % 3;
        if (i == 9) t->shape[0] = 0;
        int64_t n = attn_tensor_numel(t);
        t->data = malloc((size_t)(n > 0 ? n : 1) * attn_dtype_size(t->dtype));
        fill_pattern(t->dtype, t->data, n);
    }
    const char *p = in_tmp("rt.safetensors");
    ASSERT_OK(attn_safetensors_write(ctx, p, ts, N));
    bytes file = slurp(p);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | file.p[i];
    ASSERT_EQ_INT(hl % 8, 0);
    attn_tensor_list l;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0)
            ASSERT_OK(attn_safetensors_read(ctx, p, &l));
        else
            ASSERT_OK(attn_safetensors_parse(ctx, file.p, file.n, &l));
        ASSERT_EQ_INT(l.count, N);
        for (int i = 0; i < N; i++) {
            const attn_tensor *t = &l.tensors[i];
            ASSERT_TRUE(strcmp(t->name, ts[i].name) == 0); // written in the order given
            ASSERT_EQ_INT(t->dtype, ts[i].dtype);
            ASSERT_EQ_INT(t->ndim, ts[i].ndim);
            for (int d = 0; d < t->ndim; d++) ASSERT_EQ_INT(t->shape[d], ts[i].shape[d]);
            ASSERT_TRUE(memcmp(t->data, ts[i].data, (size_t)attn_tensor_numel(t) * attn_dtype_size(t->dtype)) == 0);
        }
        attn_tensor_list_release(ctx, &l);
    }
    free(file.p);
    // The densest valid header (2-byte names, 8 one-digit sizes) stays within the parser's
    // node budget for safetensors headers (header bytes / 4).
    {
        enum { M = 400 };
        static const char chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        attn_tensor *dense = calloc(M, sizeof *dense);
        char(*dn)[3] = calloc(M, 3);
        uint8_t one = 7;
        for (int i = 0; i < M; i++) {
            dn[i][0] = chars[i / 62];
            dn[i][1] = chars[i % 62];
            dense[i].name = dn[i];
            dense[i].dtype = i % 2 ? ATTN_DTYPE_F32 : ATTN_DTYPE_U8;
            dense[i].ndim = 8;
            for (int d = 0; d < 8; d++) dense[i].shape[d] = i % 2 ? 0 : 1;
            dense[i].data = i % 2 ? NULL : &one;
        }
        ASSERT_OK(attn_safetensors_write(ctx, in_tmp("dense.safetensors"), dense, M));
        ASSERT_OK(attn_safetensors_read(ctx, in_tmp("dense.safetensors"), &l));
        ASSERT_EQ_INT(l.count, M);
        for (int i = 0; i < M; i++) ASSERT_TRUE(strcmp(l.tensors[i].name, dn[i]) == 0);
        attn_tensor_list_release(ctx, &l);
        unlink(in_tmp("dense.safetensors"));
        free(dn);
        free(dense);
    }
    // Writer argument checks: nothing is written.
    ASSERT_EQ_INT(count_entries(tmp_dir), 1);
    const char *q = in_tmp("bad.safetensors");
    ASSERT_STATUS(attn_safetensors_write(NULL, q, ts, N), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_safetensors_write(ctx, NULL, ts, N), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_safetensors_write(ctx, q, NULL, 1), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_safetensors_write(ctx, q, ts, -1), ATTN_ERR_INVALID_ARG);
    attn_tensor bad = ts[1];
    bad.name = NULL;
    ASSERT_STATUS(attn_safetensors_write(ctx, q, &bad, 1), ATTN_ERR_INVALID_ARG);
    bad.name = "";
    ASSERT_STATUS(attn_safetensors_write(ctx, q, &bad, 1), ATTN_ERR_INVALID_ARG);
    bad.name = "\xff\xfe";
    ASSERT_STATUS(attn_safetensors_write(ctx, q, &bad, 1), ATTN_ERR_INVALID_ARG);
    bad.name = "__metadata__";
    ASSERT_STATUS(attn_safetensors_write(ctx, q, &bad, 1), ATTN_ERR_INVALID_ARG);
    bad = ts[1];
    bad.dtype = (attn_dtype)42;
    ASSERT_STATUS(attn_safetensors_write(ctx, q, &bad, 1), ATTN_ERR_INVALID_ARG);
    bad = ts[1];
    bad.ndim = 9;
    ASSERT_STATUS(attn_safetensors_write(ctx, q, &bad, 1), ATTN_ERR_INVALID_ARG);
    bad = ts[1];
    bad.shape[0] = -2;
    ASSERT_STATUS(attn_safetensors_write(ctx, q, &bad, 1), ATTN_ERR_BAD_SHAPE);
    bad.ndim = 2;
    bad.shape[0] = bad.shape[1] = INT64_C(1) << 40;
    ASSERT_STATUS(attn_safetensors_write(ctx, q, &bad, 1), ATTN_ERR_OVERFLOW);
    bad = ts[1];
    bad.data = NULL;
    ASSERT_STATUS(attn_safetensors_write(ctx, q, &bad, 1), ATTN_ERR_INVALID_ARG);
    attn_tensor dup[2] = {ts[1], ts[2]};
    dup[1].name = dup[0].name;
    ASSERT_STATUS(attn_safetensors_write(ctx, q, dup, 2), ATTN_ERR_INVALID_ARG);
    ASSERT_MSG_HAS(ctx, "duplicate name");
    ASSERT_EQ_INT(count_entries(tmp_dir), 1);
    attn_tensor_list out;
    ASSERT_STATUS(attn_safetensors_read(NULL, p, &out), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_safetensors_read(ctx, NULL, &out), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_safetensors_read(ctx, p, NULL), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_safetensors_parse(ctx, NULL, 9, &out), ATTN_ERR_INVALID_ARG);
    ASSERT_STATUS(attn_safetensors_read(ctx, in_tmp("missing.safetensors"), &out), ATTN_ERR_IO);
    ASSERT_MSG_HAS(ctx, "missing.safetensors");
    for (int i = 0; i < N; i++) free(ts[i].data);
    remove_tmp_dir();
    free_ctx(ctx, &c);
}

static void test_safetensors_truncated(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    make_tmp_dir();
    const char *files[] = {FIXTURE("multi.safetensors"), FIXTURE("empty.safetensors")};
    for (int f = 0; f < 2; f++) {
        bytes b = slurp(files[f]);
        for (size_t len = 0; len < b.n; len++) {
            attn_tensor_list l;
            attn_status st = attn_safetensors_parse(ctx, len ? b.p : NULL, len, &l);
            if (st != ATTN_ERR_BAD_FILE)
                FAIL("%s cut to %zu bytes: status %d (%s)", files[f], len, (int)st, attn_ctx_last_error(ctx));
            ASSERT_TRUE(l.count == 0 && l.tensors == NULL);
            ASSERT_EQ_INT(c.live, 1);
            spit(in_tmp("cut.safetensors"), b.p, len);
            ASSERT_STATUS(attn_safetensors_read(ctx, in_tmp("cut.safetensors"), &l), ATTN_ERR_BAD_FILE);
            ASSERT_MSG_HAS(ctx, "cut.safetensors"); // format errors name the file
            ASSERT_EQ_INT(c.live, 1);
        }
        unsigned char *longer = malloc(b.n + 3);
        memcpy(longer, b.p, b.n);
        memset(longer + b.n, 0, 3);
        attn_tensor_list l;
        ASSERT_STATUS(attn_safetensors_parse(ctx, longer, b.n + 3, &l), ATTN_ERR_BAD_FILE);
        ASSERT_MSG_HAS(ctx, "after the last tensor");
        free(longer);
        free(b.p);
    }
    remove_tmp_dir();
    free_ctx(ctx, &c);
}

// A safetensors file with header `json` (not padded) and `data_len` bytes of data.
static bytes make_st(const char *json, size_t data_len) {
    size_t hl = strlen(json);
    bytes b;
    b.n = 8 + hl + data_len;
    b.p = calloc(1, b.n + 1);
    for (int i = 0; i < 8; i++) b.p[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b.p + 8, json, hl);
    return b;
}

static void test_safetensors_lying_headers(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    // One tensor entry: "name":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}
#define E(name, dtype, shape, b, e) \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"
    static const struct {
        const char *json;
        size_t data_len;
        attn_status want;
        const char *needle;
    } cases[] = {
        {"{" E("a", "F32", "[2]", 0, 8) "}", 8, ATTN_OK, ""},
        {"{\"__metadata__\":{\"k\":\"v\"}," E("a", "F32", "[2]", 0, 8) "}   ", 8, ATTN_OK, ""},
        {"{" E("a", "F32", "[0]", 0, 0) "," E("b", "U8", "[]", 0, 1) "}", 1, ATTN_OK, ""},
        {"{}", 0, ATTN_OK, ""},
        // Sizes that lie.
        {"{" E("a", "F32", "[4]", 0, 8) "}", 8, ATTN_ERR_BAD_FILE, "does not fill"},
        {"{" E("a", "F32", "[1099511627776,1099511627776]", 0, 8) "}", 8, ATTN_ERR_BAD_FILE, "2^63"},
        {"{" E("a", "F32", "[2147483648,2147483648]", 0, 8) "}", 8, ATTN_ERR_BAD_FILE, "does not fill"},
        {"{" E("a", "F64", "[1099511627776]", 0, 8) "}", 8, ATTN_ERR_BAD_FILE, "does not fill"},
        {"{" E("a", "F32", "[2]", 0, 8796093022208) "}", 8, ATTN_ERR_BAD_FILE, "outside"},
        {"{" E("a", "F32", "[2]", 0, 100) "}", 8, ATTN_ERR_BAD_FILE, "outside"},
        {"{" E("a", "F32", "[2]", 8, 0) "}", 8, ATTN_ERR_BAD_FILE, "outside"},
        {"{" E("a", "F32", "[2]", -8, 0) "}", 8, ATTN_ERR_BAD_FILE, "non-negative integers"},
        {"{" E("a", "F32", "[2]", 0, 8.0) "}", 8, ATTN_ERR_BAD_FILE, "non-negative integers"},
        {"{" E("a", "F32", "[2]", 0, 18446744073709551616) "}", 8, ATTN_ERR_BAD_FILE, "non-negative integers"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, ATTN_ERR_BAD_FILE, "pair"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4,8]}}", 8, ATTN_ERR_BAD_FILE, "pair"},
        {"{" E("a", "F32", "[-2]", 0, 8) "}", 8, ATTN_ERR_BAD_FILE, "shape[0]"},
        {"{" E("a", "F32", "[2.0]", 0, 8) "}", 8, ATTN_ERR_BAD_FILE, "shape[0]"},
        {"{" E("a", "F32", "[\"2\"]", 0, 8) "}", 8, ATTN_ERR_BAD_FILE, "shape[0]"},
        {"{" E("a", "F32", "2", 0, 8) "}", 8, ATTN_ERR_BAD_FILE, "not an array"},
        {"{" E("a", "F32", "[1,1,1,1,1,1,1,1,2]", 0, 8) "}", 8, ATTN_ERR_UNSUPPORTED, "9 dimensions"},
        {"{" E("a", "F32", "[[[[[[[[[2]]]]]]]]]", 0, 8) "}", 8, ATTN_ERR_BAD_FILE, "deeper"},
        // Tiling of the data buffer.
        {"{" E("a", "F32", "[2]", 0, 8) "," E("b", "F32", "[2]", 4, 12) "}", 12, ATTN_ERR_BAD_FILE, "overlap"},
        {"{" E("a", "F32", "[2]", 0, 8) "," E("b", "F32", "[2]", 0, 8) "}", 8, ATTN_ERR_BAD_FILE, "overlap"},
        {"{" E("a", "F32", "[1]", 0, 4) "," E("b", "F32", "[1]", 8, 12) "}", 12, ATTN_ERR_BAD_FILE, "gap"},
        {"{" E("a", "F32", "[1]", 4, 8) "}", 8, ATTN_ERR_BAD_FILE, "starts with 4 bytes"},
        {"{" E("a", "F32", "[1]", 0, 4) "}", 8, ATTN_ERR_BAD_FILE, "4 bytes of the data buffer after"},
        {"{}", 3, ATTN_ERR_BAD_FILE, "after the last tensor"},
        {"{" E("a", "F32", "[1]", 0, 4) "," E("e", "F32", "[0]", 2, 2) "}", 4, ATTN_ERR_BAD_FILE, "overlap"},
        // Names, keys, dtypes.
        {"{" E("a", "F32", "[1]", 0, 4) "," E("a", "F32", "[1]", 4, 8) "}", 8, ATTN_ERR_BAD_FILE, "duplicate key"},
        {"{" E("", "F32", "[1]", 0, 4) "}", 4, ATTN_ERR_BAD_FILE, "empty name"},
        {"{" E("a\\u0000b", "F32", "[1]", 0, 4) "}", 4, ATTN_ERR_BAD_FILE, "NUL"},
        {"{" E("a", "I8", "[4]", 0, 4) "}", 4, ATTN_ERR_UNSUPPORTED, "dtype 'I8'"},
        {"{" E("a", "F8_E4M3", "[4]", 0, 4) "}", 4, ATTN_ERR_UNSUPPORTED, "F8_E4M3"},
        {"{" E("a", "f32", "[1]", 0, 4) "}", 4, ATTN_ERR_UNSUPPORTED, "'f32'"},
        {"{\"a\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, ATTN_ERR_BAD_FILE, "not a string"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, ATTN_ERR_BAD_FILE, "lacks 'data_offsets'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, ATTN_ERR_BAD_FILE,
         "unexpected key 'x'"},
        {"{\"a\":[0,4]}", 4, ATTN_ERR_BAD_FILE, "not an object"},
        {"{\"__metadata__\":{\"k\":1}}", 0, ATTN_ERR_BAD_FILE, "not a string"},
        {"{\"__metadata__\":[\"k\"]}", 0, ATTN_ERR_BAD_FILE, "not an object"},
        // Not a JSON object.
        {"[]", 0, ATTN_ERR_BAD_FILE, "not an object"},
        {"", 0, ATTN_ERR_BAD_FILE, "end of input"},
        {"{\"a\":", 0, ATTN_ERR_BAD_FILE, "safetensors header at byte 5"},
        {"{} x", 0, ATTN_ERR_BAD_FILE, "after the JSON value"},
    };
#undef E
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bytes b = make_st(cases[i].json, cases[i].data_len);
        attn_tensor_list l;
        c.max_request = 0;
        attn_status st = attn_safetensors_parse(ctx, b.p, b.n, &l);
        if (st != cases[i].want)
            FAIL("case %zu (%s): status %d (%s), expected %d", i, cases[i].json, (int)st, attn_ctx_last_error(ctx),
                 (int)cases[i].want);
        if (st == ATTN_OK) {
            attn_tensor_list_release(ctx, &l);
        } else {
            if (!contains(attn_ctx_last_error(ctx), cases[i].needle))
                FAIL("case %zu: message \"%s\" lacks \"%s\"", i, attn_ctx_last_error(ctx), cases[i].needle);
            ASSERT_TRUE(l.count == 0 && l.tensors == NULL);
        }
        ASSERT_TRUE(c.max_request <= 16 * 1024); // nothing sized by a lying header
        ASSERT_EQ_INT(c.live, 1);
        free(b.p);
    }
    // The header length itself lies.
    bytes b = make_st("{}", 0);
    attn_tensor_list l;
    for (int big = 0; big < 3; big++) {
        uint64_t n = big == 0 ? UINT64_MAX : big == 1 ? (UINT64_C(1) << 62) : 3;
        for (int i = 0; i < 8; i++) b.p[i] = (unsigned char)(n >> (8 * i));
        c.max_request = 0;
        ASSERT_STATUS(attn_safetensors_parse(ctx, b.p, b.n, &l), ATTN_ERR_BAD_FILE);
        ASSERT_MSG_HAS(ctx, "past the end");
        ASSERT_TRUE(c.max_request == 0);
    }
    free(b.p);
    // Over the 100 MB limit while inside the file.
    size_t n = 100000001 + 8;
    unsigned char *huge = calloc(1, n);
    huge[0] = (unsigned char)(100000001 & 0xFF);
    huge[1] = (unsigned char)((100000001 >> 8) & 0xFF);
    huge[2] = (unsigned char)((100000001 >> 16) & 0xFF);
    huge[3] = (unsigned char)(100000001 >> 24);
    c.max_request = 0;
    ASSERT_STATUS(attn_safetensors_parse(ctx, huge, n, &l), ATTN_ERR_BAD_FILE);
    ASSERT_MSG_HAS(ctx, "over the limit");
    ASSERT_TRUE(c.max_request == 0);
    free(huge);
    free_ctx(ctx, &c);
}

// ================================================================================================
// atomic writes through the public writers
// ================================================================================================

static void test_atomic_public_writers(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    make_tmp_dir();
    char np[1024], sp[1024];
    snprintf(np, sizeof np, "%s", in_tmp("x.npy"));
    snprintf(sp, sizeof sp, "%s", in_tmp("x.safetensors"));
    float v[6] = {1, 2, 3, 4, 5, 6};
    int64_t shape[2] = {2, 3};
    attn_tensor t = {"x", ATTN_DTYPE_F32, 2, {2, 3}, v};
    ASSERT_OK(attn_npy_write(ctx, np, ATTN_DTYPE_F32, 2, shape, v));
    ASSERT_OK(attn_safetensors_write(ctx, sp, &t, 1));
    // Overwriting succeeds.
    v[0] = 10;
    ASSERT_OK(attn_npy_write(ctx, np, ATTN_DTYPE_F32, 2, shape, v));
    ASSERT_OK(attn_safetensors_write(ctx, sp, &t, 1));
    attn_tensor r;
    ASSERT_OK(attn_npy_read(ctx, np, &r));
    ASSERT_TRUE(((float *)r.data)[0] == 10);
    attn_tensor_release(ctx, &r);
    bytes npy0 = slurp(np), st0 = slurp(sp);
    ASSERT_EQ_INT(count_entries(tmp_dir), 2);

    // Failing writes leave the existing files byte-identical and no temporary file behind.
    int64_t neg[2] = {2, -3};
    ASSERT_STATUS(attn_npy_write(ctx, np, ATTN_DTYPE_BF16, 2, shape, v), ATTN_ERR_UNSUPPORTED);
    ASSERT_STATUS(attn_npy_write(ctx, np, ATTN_DTYPE_F32, 2, neg, v), ATTN_ERR_BAD_SHAPE);
    attn_tensor two[2] = {t, t};
    ASSERT_STATUS(attn_safetensors_write(ctx, sp, two, 2), ATTN_ERR_INVALID_ARG); // duplicate names
    ASSERT_STATUS(attn_npy_write(ctx, in_tmp("nodir/x.npy"), ATTN_DTYPE_F32, 2, shape, v), ATTN_ERR_IO);
    ASSERT_MSG_HAS(ctx, "nodir/x.npy");
    ASSERT_STATUS(attn_safetensors_write(ctx, in_tmp("nodir/x.safetensors"), &t, 1), ATTN_ERR_IO);
    ASSERT_TRUE(mkdir(in_tmp("d.npy"), 0700) == 0);
    ASSERT_STATUS(attn_npy_write(ctx, in_tmp("d.npy"), ATTN_DTYPE_F32, 2, shape, v), ATTN_ERR_IO);
    ASSERT_EQ_INT(count_entries(tmp_dir), 3);
    // Every allocation failure along the way.
    for (int which = 0; which < 2; which++) {
        for (long k = 0;; k++) {
            c.fail_at = c.allocs + k;
            v[0] = 99;
            attn_status st = which == 0 ? attn_npy_write(ctx, np, ATTN_DTYPE_F32, 2, shape, v)
                                        : attn_safetensors_write(ctx, sp, &t, 1);
            c.fail_at = -1;
            v[0] = 10;
            if (st == ATTN_OK) break;
            ASSERT_STATUS(st, ATTN_ERR_OUT_OF_MEMORY);
            ASSERT_EQ_INT(c.live, 1);
            ASSERT_EQ_INT(count_entries(tmp_dir), 3);
            bytes now = slurp(which == 0 ? np : sp);
            ASSERT_TRUE(same_bytes(now, which == 0 ? npy0 : st0));
            free(now.p);
        }
        // Restore the original contents.
        if (which == 0)
            ASSERT_OK(attn_npy_write(ctx, np, ATTN_DTYPE_F32, 2, shape, v));
        else
            ASSERT_OK(attn_safetensors_write(ctx, sp, &t, 1));
    }
    // A write that fails half way (the file size limit is hit): EFBIG, nothing changes.
    struct rlimit old;
    ASSERT_TRUE(getrlimit(RLIMIT_FSIZE, &old) == 0);
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = old;
    lim.rlim_cur = 100;
    if (setrlimit(RLIMIT_FSIZE, &lim) == 0) {
        float big[1000] = {0};
        int64_t bshape[1] = {1000};
        attn_tensor bt = {"x", ATTN_DTYPE_F32, 1, {1000}, big};
        attn_status s1 = attn_npy_write(ctx, np, ATTN_DTYPE_F32, 1, bshape, big);
        attn_status s2 = attn_safetensors_write(ctx, sp, &bt, 1);
        setrlimit(RLIMIT_FSIZE, &old);
        ASSERT_STATUS(s1, ATTN_ERR_IO);
        ASSERT_STATUS(s2, ATTN_ERR_IO);
        ASSERT_MSG_HAS(ctx, strerror(EFBIG));
    }
    signal(SIGXFSZ, old_handler);
    ASSERT_EQ_INT(count_entries(tmp_dir), 3);
    bytes npy1 = slurp(np), st1 = slurp(sp);
    ASSERT_TRUE(same_bytes(npy0, npy1));
    ASSERT_TRUE(same_bytes(st0, st1));
    free(npy0.p);
    free(npy1.p);
    free(st0.p);
    free(st1.p);
    remove_tmp_dir();
    free_ctx(ctx, &c);
}

// ================================================================================================
// allocation failures while reading
// ================================================================================================

typedef attn_status (*read_fn)(attn_ctx *ctx, const char *path, const bytes *b);

static attn_status rd_npy_file(attn_ctx *ctx, const char *path, const bytes *b) {
    (void)b;
    attn_tensor t;
    attn_status st = attn_npy_read(ctx, path, &t);
    attn_tensor_release(ctx, &t);
    return st;
}
static attn_status rd_npy_mem(attn_ctx *ctx, const char *path, const bytes *b) {
    (void)path;
    attn_tensor t;
    attn_status st = attn_npy_parse(ctx, b->p, b->n, &t);
    attn_tensor_release(ctx, &t);
    return st;
}
static attn_status rd_st_file(attn_ctx *ctx, const char *path, const bytes *b) {
    (void)b;
    attn_tensor_list l;
    attn_status st = attn_safetensors_read(ctx, path, &l);
    attn_tensor_list_release(ctx, &l);
    return st;
}
static attn_status rd_st_mem(attn_ctx *ctx, const char *path, const bytes *b) {
    (void)path;
    attn_tensor_list l;
    attn_status st = attn_safetensors_parse(ctx, b->p, b->n, &l);
    attn_tensor_list_release(ctx, &l);
    return st;
}

static void test_read_alloc_failures(void) {
    counting c;
    attn_ctx *ctx = make_ctx(&c);
    static const struct {
        const char *file;
        read_fn fn;
    } cases[] = {
        {FIXTURE("f32_2x3.npy"), rd_npy_file},         {FIXTURE("f32_2x3.npy"), rd_npy_mem},
        {FIXTURE("empty_f32_0x3.npy"), rd_npy_file},   {FIXTURE("multi.safetensors"), rd_st_file},
        {FIXTURE("multi.safetensors"), rd_st_mem},     {FIXTURE("empty.safetensors"), rd_st_file},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bytes b = slurp(cases[i].file);
        long failures = 0;
        for (long k = 0;; k++) {
            c.fail_at = c.allocs + k;
            attn_status st = cases[i].fn(ctx, cases[i].file, &b);
            c.fail_at = -1;
            if (st == ATTN_OK) break;
            if (st != ATTN_ERR_OUT_OF_MEMORY) FAIL("case %zu, allocation %ld failed: status %d", i, k, (int)st);
            harness_checks++;
            ASSERT_EQ_INT(c.live, 1);
            failures++;
            ASSERT_TRUE(k < 100);
        }
        ASSERT_TRUE(failures >= 1);
        free(b.p);
    }
    free_ctx(ctx, &c);
}

int main(int argc, char **argv) {
    static const harness_case cases[] = {
        HARNESS_CASE(test_tensor_helpers),
        HARNESS_CASE(test_json_values),
        HARNESS_CASE(test_json_strings),
        HARNESS_CASE(test_json_numbers),
        HARNESS_CASE(test_json_errors),
        HARNESS_CASE(test_json_limits),
        HARNESS_CASE(test_json_arrays),
        HARNESS_CASE(test_json_file),
        HARNESS_CASE(test_file_read_all),
        HARNESS_CASE(test_file_atomic_write),
        HARNESS_CASE(test_npy_fixtures),
        HARNESS_CASE(test_npy_write_matches_numpy),
        HARNESS_CASE(test_npy_roundtrip),
        HARNESS_CASE(test_npy_truncated),
        HARNESS_CASE(test_npy_lying_headers),
        HARNESS_CASE(test_safetensors_fixtures),
        HARNESS_CASE(test_safetensors_write_matches_python),
        HARNESS_CASE(test_safetensors_roundtrip),
        HARNESS_CASE(test_safetensors_truncated),
        HARNESS_CASE(test_safetensors_lying_headers),
        HARNESS_CASE(test_atomic_public_writers),
        HARNESS_CASE(test_read_alloc_failures),
    };
    return harness_main(argc, argv, cases, HARNESS_COUNT(cases));
}
