// mha_state.c - placeholder
typedef int attn_placeholder_mha_state_;
