// linear.c - placeholder
typedef int attn_placeholder_linear_;
