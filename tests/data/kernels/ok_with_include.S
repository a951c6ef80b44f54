// A small valid unit that includes a header (the cache-key test edits the header).
#include "tile_defs.h"
 .section .text.tiny,"ax",@progbits
 .globl tiny_entry
 .type tiny_entry,@function
tiny_entry:
 .supervisor
 setzi $m0, TINY_VALUE
 br $m10
 .size tiny_entry, .-tiny_entry
