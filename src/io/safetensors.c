// safetensors.c - placeholder
typedef int attn_placeholder_safetensors_;
