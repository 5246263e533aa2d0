// book.c - placeholder
typedef int attn_placeholder_book_;
