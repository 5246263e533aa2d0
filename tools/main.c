// main.c - placeholder
typedef int attn_placeholder_main_;
