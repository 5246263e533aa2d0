// sdpa_ref.c - placeholder
typedef int attn_placeholder_sdpa_ref_;
