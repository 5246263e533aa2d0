// print.c - placeholder
typedef int attn_placeholder_print_;
