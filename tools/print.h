// print.h - format float32 tensors exactly as PyTorch 1.13 prints them (str(tensor) / print(tensor)).
//
// The output follows torch/_tensor_str.py with the default print options: precision 4, threshold 1000,
// edgeitems 3, linewidth 80, sci_mode None. That covers the `tensor(` prefix and the indentation of
// continuation lines, nested brackets with blank lines between the blocks of 3-d and higher tensors,
// the choice between integer style (`2.`), fixed (`2.5000`) and scientific (`2.5000e+00`) notation,
// the common right-aligned width, nan/inf/-inf, negative zero, wrapping of long rows at 80 columns,
// summarization with `...` above 1000 elements (only the shown edge elements are read), 0-d tensors,
// and empty tensors (`tensor([])`, `tensor([], size=(0, 3))`).
//
// Data are dense, contiguous, row-major float32 values; `shape` holds `ndim` extents (ndim 0 is a
// scalar and reads one value; `shape` may then be NULL).
//
// Suffixes: `suffix` is NULL (or "") for a plain tensor, or the text PyTorch appends after the data,
// such as "grad_fn=<MmBackward0>" or "requires_grad=True". Several suffixes may be given separated by
// '\n' (e.g. "requires_grad=True\nnames=('N', 'C')"); each is placed as PyTorch places it: after ", "
// on the same line, or on a new line indented by 7 when the line would pass 80 columns. The
// "size=(...)" suffix of empty tensors is added automatically, before the caller's suffixes.
//
// Invalid arguments (ndim < 0 or > ATTN_PRINT_MAX_NDIM, a negative extent, NULL shape or data where
// they are needed, an element count that overflows) format as the empty string: the format functions
// return 0 and the print functions return -1, writing nothing. No function keeps any state.
#ifndef ATTN_TOOLS_PRINT_H
#define ATTN_TOOLS_PRINT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

// The largest number of dimensions accepted (PyTorch's own limit).
#define ATTN_PRINT_MAX_NDIM 64

// Formats the tensor like PyTorch's str(tensor), with no trailing newline. Works like snprintf:
// writes at most `cap` bytes including the terminating NUL (nothing when cap is 0, and buf may then
// be NULL) and returns the length of the full text, so a return value >= cap means it was truncated.
size_t attn_format_tensor(char *buf, size_t cap, const float *data, int ndim, const int64_t *shape,
                          const char *suffix);

// Like attn_format_tensor, for an nn.Parameter: "Parameter containing:\n" followed by the tensor
// with the suffix "requires_grad=True" (then `suffix`, if any).
size_t attn_format_parameter(char *buf, size_t cap, const float *data, int ndim, const int64_t *shape,
                             const char *suffix);

// Like print(tensor): writes the text of attn_format_tensor and a newline to `f`, streaming it (no
// allocation). Returns 0, or -1 on invalid arguments (nothing written) or a write error.
int attn_print_tensor(FILE *f, const float *data, int ndim, const int64_t *shape, const char *suffix);

// Like print(parameter): the text of attn_format_parameter and a newline. Returns 0 or -1.
int attn_print_parameter(FILE *f, const float *data, int ndim, const int64_t *shape, const char *suffix);

#ifdef __cplusplus
}
#endif

#endif
