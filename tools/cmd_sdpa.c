// cmd_sdpa.c - placeholder
typedef int attn_placeholder_cmd_sdpa_;
