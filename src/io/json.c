// json.c - placeholder
typedef int attn_placeholder_json_;
