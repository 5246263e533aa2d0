// sdpa.c - placeholder
typedef int attn_placeholder_sdpa_;
