/* The stored record's layout shared by the C files of orbitmq._native (orbitmq/common/record.py
 * is the reference): header size, where the CRC starts, the magic, big-endian reads and writes. */
#ifndef ORBITMQ_RECORD_H
#define ORBITMQ_RECORD_H
#include <stdint.h>

#define HEADER_SIZE 88
#define CRC_START 12
#define MAGIC 0x4F524231u

static inline void be32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}
static inline void be64(unsigned char *p, uint64_t v) {
    be32(p, (uint32_t)(v >> 32)); be32(p + 4, (uint32_t)v);
}
static inline uint32_t rd32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t rd64(const unsigned char *p) {
    return ((uint64_t)rd32(p) << 32) | rd32(p + 4);
}
static inline unsigned rd16(const unsigned char *p) { return ((unsigned)p[0] << 8) | p[1]; }

#endif
