// npy.c - placeholder
typedef int attn_placeholder_npy_;
