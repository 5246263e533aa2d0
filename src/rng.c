// rng.c - placeholder
typedef int attn_placeholder_rng_;
