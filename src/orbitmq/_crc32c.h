/* CRC-32C (Castagnoli) shared by the optional C extensions (orbitmq._native,
 * orbitmq._kafka_native): the SSE4.2 instruction when the CPU has it, else slicing-by-8 tables.
 * Each extension includes this file once and calls crc_init() from its module init (the tables
 * and the CPU check are per extension: each builds and loads on its own). The slicing path reads
 * 8 bytes at a time as a little-endian word, so crc_init() refuses big-endian hosts (the
 * module's import then fails and its Python fallback is used). */
#ifndef ORBITMQ_CRC32C_H
#define ORBITMQ_CRC32C_H

#include <stdint.h>
#include <string.h>

static uint32_t table[8][256];
static int have_sse42 = 0;

static void crc_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
}

static uint32_t crc_soft(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) { crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xFF]; n--; }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc; /* little-endian hosts only: checked at import */
        crc = table[7][w & 0xFF] ^ table[6][(w >> 8) & 0xFF] ^ table[5][(w >> 16) & 0xFF] ^
              table[4][(w >> 24) & 0xFF] ^ table[3][(w >> 32) & 0xFF] ^ table[2][(w >> 40) & 0xFF] ^
              table[1][(w >> 48) & 0xFF] ^ table[0][(w >> 56) & 0xFF];
        p += 8; n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t c = ~crc;
    while (n && ((uintptr_t)p & 7)) { c = __builtin_ia32_crc32qi((uint32_t)c, *p++); n--; }
    while (n >= 8) { uint64_t w; memcpy(&w, p, 8); c = __builtin_ia32_crc32di(c, w); p += 8; n -= 8; }
    while (n--) c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#define HAVE_HW 1
#endif

static uint32_t crc32c(uint32_t crc, const unsigned char *p, size_t n) {
#ifdef HAVE_HW
    if (have_sse42) return crc_hw(crc, p, n);
#endif
    return crc_soft(crc, p, n);
}

/* 0 on a big-endian host (the tables assume little-endian words), else 1: tables built and
 * the SSE4.2 check done. */
static int crc_init(void) {
    const uint16_t probe = 1;
    if (*(const unsigned char *)&probe != 1) return 0;
    crc_tables();
#ifdef HAVE_HW
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
    return 1;
}

#endif
