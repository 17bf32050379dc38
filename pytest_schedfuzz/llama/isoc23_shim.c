/* glibc 2.38's C23 entry points for llama.cpp b11739's libraries on an older glibc (upstream.py).
   Compiled as C11, so the strtol & co. and vsscanf called here are glibc's C99 ones. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* C23's strto* read a 0b/0B prefix when base is 0 or 2, where C99's read "0" and stop at the b:
   the binary digits after such a prefix (and the sign, into *negative), NULL without one. */
static const char *binary_digits(const char *s, int base, int *negative) {
    if (base != 0 && base != 2) return NULL;
    while (isspace((unsigned char) *s)) s++;
    *negative = *s == '-';
    if (*s == '+' || *s == '-') s++;
    return s[0] == '0' && (s[1] == 'b' || s[1] == 'B') && (s[2] == '0' || s[2] == '1') ? s + 2 : NULL;
}

/* The magnitude of binary digits; *overflow when it exceeds ULLONG_MAX. errno as it was. */
static unsigned long long magnitude(const char *digits, char **end, int *overflow) {
    int saved = errno;
    errno = 0;
    unsigned long long m = strtoull(digits, end, 2);
    *overflow = errno == ERANGE;
    errno = saved;
    return m;
}

long __isoc23_strtol(const char *s, char **end, int base) {
    int negative, overflow;
    const char *digits = binary_digits(s, base, &negative);
    if (digits == NULL) return strtol(s, end, base);
    unsigned long long m = magnitude(digits, end, &overflow);
    if (overflow || m > (negative ? (unsigned long long) LONG_MAX + 1 : (unsigned long long) LONG_MAX)) {
        errno = ERANGE;
        return negative ? LONG_MIN : LONG_MAX;
    }
    return negative ? (long) (0 - m) : (long) m;
}

unsigned long __isoc23_strtoul(const char *s, char **end, int base) {
    int negative, overflow;
    const char *digits = binary_digits(s, base, &negative);
    if (digits == NULL) return strtoul(s, end, base);
    unsigned long long m = magnitude(digits, end, &overflow);
    if (overflow || m > ULONG_MAX) {
        errno = ERANGE;
        return ULONG_MAX;
    }
    return negative ? 0 - (unsigned long) m : (unsigned long) m;  /* C's unsigned negation */
}

unsigned long long __isoc23_strtoull(const char *s, char **end, int base) {
    int negative, overflow;
    const char *digits = binary_digits(s, base, &negative);
    if (digits == NULL) return strtoull(s, end, base);
    unsigned long long m = magnitude(digits, end, &overflow);
    if (overflow) {
        errno = ERANGE;
        return ULLONG_MAX;
    }
    return negative ? 0 - m : m;
}

/* C99's sscanf: it differs from C23's in %i (no 0b prefix) and %b (no binary conversion). */
int __isoc23_sscanf(const char *s, const char *format, ...) {
    va_list ap;
    va_start(ap, format);
    int n = vsscanf(s, format, ap);
    va_end(ap);
    return n;
}
