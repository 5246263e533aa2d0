// mha.c - placeholder
typedef int attn_placeholder_mha_;
