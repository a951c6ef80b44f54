#define TINY_VALUE 7
