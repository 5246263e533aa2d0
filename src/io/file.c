// file.c - placeholder
typedef int attn_placeholder_file_;
