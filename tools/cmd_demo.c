// cmd_demo.c - placeholder
typedef int attn_placeholder_cmd_demo_;
