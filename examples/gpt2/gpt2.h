// gpt2.h - a whole GPT-2 in C on attn: the GPTModel of "Build a Large Language Model (From
// Scratch)", ch. 4, with Hugging Face's parameter names, so a GPT-2 checkpoint of any size loads.
//
//   x      = wte[tokens] + wpe[positions]                       token + position embeddings
//   for each of the n_layer blocks (pre-LayerNorm):
//     x    = x + attn(ln_1(x))                                  causal multi-head attention
//     x    = x + c_proj(gelu(c_fc(ln_2(x))))                    MLP, GELU (tanh approximation)
//   logits = ln_f(x) wte^T                                      output head tied to wte
//
// The attention of each block is attn's nn.MultiheadAttention (attn_mha), built from the block's
// c_attn (the packed q, k, v projection) and c_proj; decoding runs attn_mha_forward_cached on one
// attn_kv_cache per block, and the full causal recomputation (gpt2_forward_full, for checks) runs
// attn_mha_forward. Every projection is attn_linear. LayerNorm and GELU are plain loops here
// (gpt2_layer_norm, gpt2_gelu): they are a few lines each and not attention.
//
// Weights are float32 in memory. Hugging Face stores the Conv1D weights of c_attn, c_proj and
// c_fc as (in, out); they are transposed once when loaded into nn.Linear's (out, in) layout, the
// one whose one-row products stream the weight at memory speed while decoding.
//
// Errors: every function that can fail returns an attn_status and, on failure, writes a one-line
// message to `err` (GPT2_ERR_LEN bytes; it may be NULL): the library's message for library
// failures, the model's own otherwise (a missing tensor, a shape that does not match, ...).
// Nothing here prints or exits. Sequences are one at a time (batch 1).
#ifndef ATTN_EXAMPLES_GPT2_H
#define ATTN_EXAMPLES_GPT2_H

#include <stdint.h>

#include "attn.h"

#define GPT2_ERR_LEN 256

// ---- configuration ------------------------------------------------------------------------------

typedef enum gpt2_activation {
    GPT2_GELU_TANH = 0, // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): "gelu_new", GPT-2's own
    GPT2_GELU_ERF = 1   // 0.5 x (1 + erf(x / sqrt(2))): "gelu"
} gpt2_activation;

typedef struct gpt2_config {
    int64_t vocab_size;        // V
    int64_t n_positions;       // the context length: positions 0 .. n_positions - 1
    int64_t n_embd;            // E
    int64_t n_head;            // H, E % H == 0
    int64_t n_layer;           // transformer blocks
    int64_t n_inner;           // I, the MLP's width (4 E)
    double layer_norm_epsilon; // 1e-5
    gpt2_activation activation;
    int tie_word_embeddings;   // 1: the output head is wte; 0: its own lm_head.weight (V, E)
} gpt2_config;

// GPT-2 small (124M): V 50257, context 1024, E 768, 12 heads, 12 layers, I 3072, eps 1e-5, tied.
void gpt2_config_init(gpt2_config *cfg);
// Checks sizes (>= 1, E % H == 0) and that the parameter count fits memory sizes.
attn_status gpt2_config_check(const gpt2_config *cfg, char *err);
// Parameters of the model (the tied head counted once).
int64_t gpt2_param_count(const gpt2_config *cfg);

// Reads a Hugging Face GPT-2 config.json: vocab_size, n_positions (or n_ctx), n_embd, n_head,
// n_layer, n_inner (null: 4 n_embd), layer_norm_epsilon, activation_function ("gelu_new",
// "gelu_pytorch_tanh", "gelu_fast" or "gelu"), tie_word_embeddings; fields left out keep cfg's
// values. Refused with ATTN_ERR_UNSUPPORTED: model_type other than "gpt2", scale_attn_weights
// false, scale_attn_by_inverse_layer_idx or add_cross_attention true, another activation. Other
// fields are ignored. ATTN_ERR_IO when the file cannot be read, ATTN_ERR_BAD_FILE for bad JSON or
// a field of the wrong type.
attn_status gpt2_config_read(const char *path, gpt2_config *cfg, char *err);
// Writes cfg as a config.json that transformers' GPT2Config reads (model_type "gpt2").
attn_status gpt2_config_write(const char *path, const gpt2_config *cfg, char *err);

// ---- the model ----------------------------------------------------------------------------------

typedef struct gpt2_block {
    float *ln_1_weight, *ln_1_bias; // (E)
    attn_mha *attn;                 // nn.MultiheadAttention(E, H): in_proj = c_attn^T, out_proj = c_proj^T
    float *ln_2_weight, *ln_2_bias; // (E)
    float *fc_weight;               // (I, E): mlp.c_fc.weight^T
    float *fc_bias;                 // (I)
    float *proj_weight;             // (E, I): mlp.c_proj.weight^T
    float *proj_bias;               // (E)
} gpt2_block;

typedef struct gpt2_model {
    gpt2_config cfg;
    float *wte;                     // (V, E) token embeddings
    float *wpe;                     // (n_positions, E) position embeddings
    gpt2_block *blocks;             // n_layer blocks
    float *ln_f_weight, *ln_f_bias; // (E)
    float *lm_head;                 // (V, E): wte when tied
    float *params;                  // the one allocation every float above points into (not the MHAs')
} gpt2_model;

// A model with random weights, drawn from the context's generator as Hugging Face initialises
// GPT-2: every weight matrix and embedding N(0, 0.02), the two residual projections (attn.c_proj,
// mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorms weight 1 and bias 0. The draws
// run in the order wte, wpe, then block by block c_attn, attn.c_proj, c_fc, mlp.c_proj, then
// lm_head when untied, each in Hugging Face's (in, out) layout.
attn_status gpt2_create_random(attn_ctx *ctx, const gpt2_config *cfg, gpt2_model **model, char *err);

// Loads a Hugging Face GPT-2 checkpoint (GPT2LMHeadModel's names under "transformer.", or
// GPT2Model's without the prefix, as save_pretrained writes them), tensors F32, F16 or BF16
// (converted to float32). The configuration comes from `config_path` when given, else from
// config.json beside the file when there is one; sizes it does not give are read off the tensors'
// shapes (V and E from wte, the context from wpe, n_layer by counting blocks, I from c_fc), and the
// head count, which no shape tells, is then E / 64 (every released GPT-2 has heads of 64). Every
// tensor's shape is checked against the configuration. The causal-mask buffers of old checkpoints
// (attn.bias, attn.masked_bias) are skipped, and so is lm_head.weight when the configuration ties
// the head to wte (as transformers does); any other name is an error. Peak memory is about the file's
// size: each tensor is released once converted.
attn_status gpt2_load(attn_ctx *ctx, const char *path, const char *config_path, gpt2_model **model, char *err);

// Writes the model as Hugging Face does: DIR/model.safetensors (GPT2LMHeadModel's names, Conv1D
// (in, out) weights, float32; lm_head.weight only when untied) and DIR/config.json. DIR is created
// when missing (its parent must exist).
attn_status gpt2_save(attn_ctx *ctx, const gpt2_model *model, const char *dir, char *err);

void gpt2_free(gpt2_model *model); // NULL is allowed

// ---- running it ---------------------------------------------------------------------------------

// What one sequence needs: a KV cache per block and the scratch of a forward of up to `capacity`
// tokens (allocated once, so no forward allocates).
typedef struct gpt2_state {
    attn_kv_cache **cache; // n_layer caches (batch 1, H heads of E / H, `capacity` positions)
    int64_t capacity;      // positions, <= n_positions
    float *x;              // (capacity, E) the residual stream
    float *h;              // (capacity, E) a LayerNorm's output
    float *a;              // (capacity, E) a sublayer's output (attention or MLP)
    float *m;              // (capacity, I) the MLP's hidden layer
} gpt2_state;

// capacity: the longest sequence (prompt + new tokens), 1 .. n_positions. kv_dtype: the caches'
// storage, ATTN_DTYPE_F32, F16 or BF16.
attn_status gpt2_state_create(attn_ctx *ctx, const gpt2_model *model, int64_t capacity, attn_dtype kv_dtype,
                              gpt2_state **state, char *err);
void gpt2_state_free(const gpt2_model *model, gpt2_state *state);
// Empties the caches (a new sequence); their memory is kept.
void gpt2_state_reset(const gpt2_model *model, gpt2_state *state);
// The number of tokens in the caches.
int64_t gpt2_state_length(const gpt2_state *state);

// Runs n new tokens of the sequence (token ids in [0, V)) at the positions that follow the ones in
// the caches, appending their keys and values: the prompt in one call (prefill), then one token per
// call (decode). logits: (n, V) when all_logits, else (V) for the last token only (what generation
// needs: the output head is then one row). ATTN_ERR_CAPACITY when the sequence would pass the
// state's capacity.
attn_status gpt2_forward(attn_ctx *ctx, const gpt2_model *model, gpt2_state *state, const int32_t *tokens, int64_t n,
                         float *logits, int all_logits, char *err);

// The same logits without the caches: the whole sequence tokens[0 .. n) from position 0, each
// block's causal attention recomputed over it (attn_mha_forward). Uses the state's scratch and
// leaves its caches alone. For checking the cached path.
attn_status gpt2_forward_full(attn_ctx *ctx, const gpt2_model *model, gpt2_state *state, const int32_t *tokens,
                              int64_t n, float *logits, int all_logits, char *err);

// ---- generation ---------------------------------------------------------------------------------

// How the next token is chosen from the last position's logits: greedy (top_k <= 1 or temperature
// == 0: the largest logit, the first one on ties, as torch.argmax), or top-k sampling: the k
// largest logits divided by the temperature, softmax over them, one uniform draw u from the
// generator (attn_rand_uniform) and the first candidate, in decreasing order of logit, whose
// cumulative probability passes u. The candidates are exactly k: among equal logits the lower ids
// come first. (The draws are not torch.multinomial's: the same seed gives other tokens than
// PyTorch's sampling would.)
typedef struct gpt2_sampler {
    int64_t top_k;
    double temperature;
    int64_t *index; // scratch of top_k entries (gpt2_sampler_init allocates it)
    float *value;
} gpt2_sampler;

attn_status gpt2_sampler_init(gpt2_sampler *s, int64_t top_k, double temperature, int64_t vocab_size, char *err);
void gpt2_sampler_free(gpt2_sampler *s);
// The next token from logits (V). gen is drawn from only when sampling.
int32_t gpt2_sample(gpt2_sampler *s, const float *logits, int64_t vocab_size, attn_generator *gen);

typedef struct gpt2_timing {
    double prefill_s; // the prompt's forward, its logits and the first token's choice
    double decode_s;  // every later step: one token's forward and the next token's choice
    int64_t decode_steps;
} gpt2_timing;

// Called after every step of gpt2_generate with the sequence so far (tokens[0 .. len): the prompt
// and the tokens generated before this step) and the logits (V) that chose the next one; its time
// is not counted. A status other than ATTN_OK stops the generation and is returned.
typedef attn_status (*gpt2_step_fn)(void *user, const int32_t *tokens, int64_t len, const float *logits);

// Generates n_new tokens after the prompt: tokens[0 .. n_prompt) holds the prompt (n_prompt >= 1
// ids) and receives the new ids in tokens[n_prompt .. n_prompt + n_new). Resets the state first,
// then one prefill and n_new - 1 decoding steps (the last token is chosen, never run). Samples
// with the context's generator. logits: scratch of V floats. on_step may be NULL.
attn_status gpt2_generate(attn_ctx *ctx, const gpt2_model *model, gpt2_state *state, gpt2_sampler *sampler,
                          int32_t *tokens, int64_t n_prompt, int64_t n_new, float *logits, gpt2_step_fn on_step,
                          void *user, gpt2_timing *timing, char *err);

// ---- building blocks ----------------------------------------------------------------------------

// y = (x - mean) / sqrt(var + eps) * weight + bias over each row of E (torch.nn.LayerNorm: biased
// variance; mean and variance summed in double). x, y: (rows, E); y may be x.
void gpt2_layer_norm(const float *x, int64_t rows, int64_t E, const float *weight, const float *bias, double eps,
                     float *y);
// x = gelu(x) in place over n elements.
void gpt2_gelu(float *x, int64_t n, gpt2_activation act);

#endif
