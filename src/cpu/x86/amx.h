// amx.h - the AMX tile operations of the bf16 tile kernels, behind small macros so that the same
// kernel source runs on the hardware or, in a build configured with ATTN_EMULATE_AVX512=ON (for
// tests; see simd512.h), on a plain-C model of the tiles kept in the calling function's frame.
//
// A tile is up to 16 rows of up to 64 bytes. The kernels configure 8 tiles of 16 rows x 64 bytes
// (palette 1) and use:
//   AMX_LOAD(t, p, stride)   tile t = 16 rows of 64 bytes, row r at (char *)p + r * stride
//   AMX_STORE(t, p, stride)  the reverse
//   AMX_ZERO(t)              tile t = 0
//   AMX_DPBF16(c, a, b)      tdpbf16ps: c (16 x 16 float) += a (16 rows x 16 bf16 pairs) b (16 pair
//                            rows x 16 columns of pairs): c[m][n] += a[m][2k] b[k][2n] + a[m][2k+1] b[k][2n+1]
// between AMX_BEGIN(cfg) (a function's first tile use; cfg from amx_config_all) and AMX_END()
// (tilerelease). AMX_STATE declares the emulated tiles (nothing on the hardware).
// The emulation checks the kernels' blocking and packing, not the hardware's rounding details
// (tdpbf16ps flushes denormal inputs and outputs to zero; the model keeps them).
#ifndef ATTN_CPU_X86_AMX_H
#define ATTN_CPU_X86_AMX_H

#include <stdint.h>
#include <string.h>

// The 64-byte tile configuration (ldtilecfg's operand): palette 1, every tile 16 rows x 64 bytes.
typedef struct attn__amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} attn__amx_config;

static inline attn__amx_config amx_config_all(void) {
    attn__amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.colsb[t] = 64, c.rows[t] = 16;
    return c;
}

#if !defined(ATTN_EMULATE_AVX512)
#include <immintrin.h>

#define AMX_STATE
#define AMX_BEGIN(cfg) _tile_loadconfig(cfg)
#define AMX_END() _tile_release()
#define AMX_LOAD(t, p, stride) _tile_loadd(t, p, stride)
#define AMX_STORE(t, p, stride) _tile_stored(t, p, stride)
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_DPBF16(c, a, b) _tile_dpbf16ps(c, a, b)
#else
// The eight tiles of the model, as bytes (a tile of floats or of bf16 pairs, 4 bytes a column).
typedef struct attn__amx_emu {
    uint8_t t[8][16][64];
} attn__amx_emu;

static inline void emu_amx_load(attn__amx_emu *s, int t, const void *p, int64_t stride) {
    for (int r = 0; r < 16; r++) memcpy(s->t[t][r], (const char *)p + r * stride, 64);
}
static inline void emu_amx_store(const attn__amx_emu *s, int t, void *p, int64_t stride) {
    for (int r = 0; r < 16; r++) memcpy((char *)p + r * stride, s->t[t][r], 64);
}
static inline float emu_amx_bf16(const uint8_t *tile_row, int i) {
    uint16_t h;
    memcpy(&h, tile_row + 2 * i, 2);
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
// tdpbf16ps as the instruction's pseudo-code orders it: per output, pair k's two products added in turn.
static inline void emu_amx_dpbf16(attn__amx_emu *s, int c, int a, int b) {
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float acc;
            memcpy(&acc, s->t[c][m] + 4 * n, 4);
            for (int k = 0; k < 16; k++) {
                acc += emu_amx_bf16(s->t[a][m], 2 * k) * emu_amx_bf16(s->t[b][k], 2 * n);
                acc += emu_amx_bf16(s->t[a][m], 2 * k + 1) * emu_amx_bf16(s->t[b][k], 2 * n + 1);
            }
            memcpy(s->t[c][m] + 4 * n, &acc, 4);
        }
}

#define AMX_STATE attn__amx_emu amx_emu_
#define AMX_BEGIN(cfg) ((void)(cfg), memset(&amx_emu_, 0, sizeof amx_emu_))
#define AMX_END() ((void)0)
#define AMX_LOAD(t, p, stride) emu_amx_load(&amx_emu_, t, p, stride)
#define AMX_STORE(t, p, stride) emu_amx_store(&amx_emu_, t, p, stride)
#define AMX_ZERO(tile) memset(amx_emu_.t[tile], 0, sizeof amx_emu_.t[tile])
#define AMX_DPBF16(c, a, b) emu_amx_dpbf16(&amx_emu_, c, a, b)
#endif

#endif
