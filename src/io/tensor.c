// tensor.c - placeholder
typedef int attn_placeholder_tensor_;
