// args.c - placeholder
typedef int attn_placeholder_args_;
