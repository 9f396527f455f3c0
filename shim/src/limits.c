/*
 * Limits-file parser (Contract 4). Pure: no I/O, no globals, so the fuzz
 * target exercises exactly what the shim runs.
 */
#include "limits.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define HAVE_UUID 1
#define HAVE_MEMORY 2
#define HAVE_CORES 4
#define HAVE_ALL 7

static void fail(char *err, size_t errlen, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void fail(char *err, size_t errlen, int line, const char *fmt, ...)
{
	if (!err || !errlen)
		return;
	int n = snprintf(err, errlen, "line %d: ", line);
	if (n < 0 || (size_t)n >= errlen)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
	va_end(ap);
}

/* Only spaces and tabs are trimmed: the writer never produces anything else. */
static int is_space(char c)
{
	return c == ' ' || c == '\t';
}

/* The characters pkg/limits accepts in a GPU UUID. */
static int uuid_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
	       c == '_' || c == '.' || c == ':' || c == '/';
}

/* Trims [*s, *e) in place. */
static void trim(const char **s, const char **e)
{
	while (*s < *e && is_space(**s))
		(*s)++;
	while (*e > *s && is_space((*e)[-1]))
		(*e)--;
}

static int span_eq(const char *s, const char *e, const char *lit)
{
	size_t n = strlen(lit);
	return (size_t)(e - s) == n && memcmp(s, lit, n) == 0;
}

/* Decimal without sign or leading zeros (the Go writer's strconv form). */
static int parse_u64(const char *s, const char *e, uint64_t *out)
{
	if (s == e || (e - s > 1 && *s == '0'))
		return -1;
	uint64_t v = 0;
	for (; s < e; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		unsigned d = (unsigned)(*s - '0');
		if (v > (UINT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

int vgpu_limits_parse(const char *buf, size_t len, struct vgpu_limits *out, char *err, size_t errlen)
{
	int have[VGPU_MAX_DEVICES] = {0};
	int have_policy = 0, have_level = 0, have_version = 0, have_shards = 0;
	int line = 0;

	memset(out, 0, sizeof(*out));
	out->policy = VGPU_POLICY_HARD;
	out->log_level = VGPU_LOG_WARN;
	if (err && errlen)
		err[0] = '\0';

	if (len > VGPU_LIMITS_MAX_SIZE) {
		fail(err, errlen, 0, "file is %zu bytes, more than %d", len, VGPU_LIMITS_MAX_SIZE);
		return -1;
	}

	const char *p = buf, *end = buf + len;
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *ls = p, *le = nl ? nl : end;
		p = nl ? nl + 1 : end;
		line++;

		/* Control characters (CR, NUL, ...) other than tab: not ours, refuse. */
		for (const char *c = ls; c < le; c++)
			if ((unsigned char)*c < 0x20 ? *c != '\t' : *c == 0x7f) {
				fail(err, errlen, line, "control character 0x%02x", (unsigned char)*c);
				return -1;
			}

		const char *hash = memchr(ls, '#', (size_t)(le - ls));
		if (hash)
			le = hash;
		trim(&ls, &le);
		if (ls == le)
			continue;

		const char *eq = memchr(ls, '=', (size_t)(le - ls));
		if (!eq) {
			fail(err, errlen, line, "expected key=value");
			return -1;
		}
		const char *ks = ls, *ke = eq, *vs = eq + 1, *ve = le;
		trim(&ks, &ke);
		trim(&vs, &ve);

		if (!have_version) {
			if (!span_eq(ks, ke, "version")) {
				fail(err, errlen, line, "first setting must be version=1");
				return -1;
			}
			if (!span_eq(vs, ve, "1")) {
				fail(err, errlen, line, "unsupported version %.*s (want 1)", (int)(ve - vs), vs);
				return -1;
			}
			have_version = 1;
			continue;
		}

		if (span_eq(ks, ke, "version")) {
			fail(err, errlen, line, "duplicate key version");
			return -1;
		}
		if (span_eq(ks, ke, "cores.policy")) {
			if (have_policy++) {
				fail(err, errlen, line, "duplicate key cores.policy");
				return -1;
			}
			if (span_eq(vs, ve, "hard"))
				out->policy = VGPU_POLICY_HARD;
			else if (span_eq(vs, ve, "burst"))
				out->policy = VGPU_POLICY_BURST;
			else {
				fail(err, errlen, line, "cores.policy must be hard or burst");
				return -1;
			}
			continue;
		}
		if (span_eq(ks, ke, "log.level")) {
			static const char *const names[] = {"error", "warn", "info", "debug"};
			if (have_level++) {
				fail(err, errlen, line, "duplicate key log.level");
				return -1;
			}
			int lv = -1;
			for (int i = 0; i < 4; i++)
				if (span_eq(vs, ve, names[i]))
					lv = i;
			if (lv < 0) {
				fail(err, errlen, line, "log.level must be error, warn, info or debug");
				return -1;
			}
			out->log_level = lv;
			continue;
		}
		if (span_eq(ks, ke, "ledger.shards")) {
			uint64_t k;
			if (have_shards++) {
				fail(err, errlen, line, "duplicate key ledger.shards");
				return -1;
			}
			if (parse_u64(vs, ve, &k) != 0 || k < 1 || k > VGPU_LEDGER_MAX_SHARDS) {
				fail(err, errlen, line, "ledger.shards must be 1..%d", VGPU_LEDGER_MAX_SHARDS);
				return -1;
			}
			out->shards = (int)k;
			continue;
		}
		if (ke - ks > 4 && memcmp(ks, "gpu.", 4) == 0) {
			const char *ns = ks + 4, *ne = memchr(ns, '.', (size_t)(ke - ns));
			uint64_t n;
			if (!ne || parse_u64(ns, ne, &n) != 0 || n >= VGPU_MAX_DEVICES) {
				fail(err, errlen, line, "bad GPU index in %.*s (0..%d)", (int)(ke - ks), ks,
				     VGPU_MAX_DEVICES - 1);
				return -1;
			}
			const char *fs = ne + 1;
			struct vgpu_gpu_limit *g = &out->gpu[n];
			int bit;
			if (span_eq(fs, ke, "uuid")) {
				bit = HAVE_UUID;
				if (vs == ve || ve - vs >= VGPU_UUID_LEN) {
					fail(err, errlen, line, "gpu.%d.uuid must be 1..%d characters", (int)n,
					     VGPU_UUID_LEN - 1);
					return -1;
				}
				for (const char *c = vs; c < ve; c++)
					if (!uuid_char(*c) || (*c == ':' && (c + 1 == ve || c[1] == ':'))) {
						fail(err, errlen, line,
						     "gpu.%d.uuid: only A-Z a-z 0-9 - _ . : / (no \"::\", no final ':')",
						     (int)n);
						return -1;
					}
				if (!(have[n] & HAVE_UUID)) {
					memcpy(g->uuid, vs, (size_t)(ve - vs));
					g->uuid[ve - vs] = '\0';
				}
			} else if (span_eq(fs, ke, "memory")) {
				bit = HAVE_MEMORY;
				if (parse_u64(vs, ve, &g->memory) != 0) {
					fail(err, errlen, line, "gpu.%d.memory must be a byte count", (int)n);
					return -1;
				}
			} else if (span_eq(fs, ke, "cores")) {
				bit = HAVE_CORES;
				uint64_t c;
				if (parse_u64(vs, ve, &c) != 0 || c < 1 || c > 100) {
					fail(err, errlen, line, "gpu.%d.cores must be 1..100", (int)n);
					return -1;
				}
				g->cores = (int)c;
			} else {
				fail(err, errlen, line, "unknown key %.*s", (int)(ke - ks), ks);
				return -1;
			}
			if (have[n] & bit) {
				fail(err, errlen, line, "duplicate key %.*s", (int)(ke - ks), ks);
				return -1;
			}
			have[n] |= bit;
			continue;
		}
		fail(err, errlen, line, "unknown key %.*s", (int)(ke - ks), ks);
		return -1;
	}

	if (!have_version) {
		fail(err, errlen, line, "missing version=1");
		return -1;
	}
	int n = 0;
	while (n < VGPU_MAX_DEVICES && have[n])
		n++;
	for (int i = n; i < VGPU_MAX_DEVICES; i++)
		if (have[i]) {
			fail(err, errlen, line, "gpu.%d given but gpu.%d missing (indices must run from 0)", i, n);
			return -1;
		}
	if (n == 0) {
		fail(err, errlen, line, "no GPUs");
		return -1;
	}
	for (int i = 0; i < n; i++) {
		if (have[i] != HAVE_ALL) {
			fail(err, errlen, line, "gpu.%d needs uuid, memory and cores", i);
			return -1;
		}
		for (int j = 0; j < i; j++)
			if (strcmp(out->gpu[i].uuid, out->gpu[j].uuid) == 0) {
				fail(err, errlen, line, "gpu.%d and gpu.%d have the same uuid", j, i);
				return -1;
			}
	}
	out->ngpu = n;
	return 0;
}
