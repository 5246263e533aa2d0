// cmd_mha.c - placeholder
typedef int attn_placeholder_cmd_mha_;
