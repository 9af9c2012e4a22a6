/* Secrets hidden from what mg records or prints: the command line in the
 * event log, usage errors, the messages of error files. What counts as a
 * secret (docs/logs.md#secrets): a URL's password ("user:***@") or its
 * userinfo without one ("***@"); the value of NAME=VALUE where NAME looks
 * like a secret's (token, password, passwd, secret, api key, access key,
 * credential, private key: AWS_SECRET_ACCESS_KEY=..., --rdzv_conf token=...,
 * ?token=... in a URL); the word after "Bearer "; and on a
 * command line the argument after such a flag (--token X). A value of digits
 * alone is left (--max_tokens 512). */
#ifndef MG_REDACT_H
#define MG_REDACT_H

#include <stddef.h>

#define MG_REDACTED "***"

/* text with its secrets replaced by MG_REDACTED, into out (cut to cap).
 * Returns 1 when something was hidden, else 0. */
int mg_redact(const char *text, char *out, size_t cap);

/* The same for one argument of a command line; prev is the one before it
 * (NULL for the first). */
int mg_redact_arg(const char *prev, const char *arg, char *out, size_t cap);

/* mg_redact on a message in place (buf holds cap bytes). */
void mg_redact_inplace(char *buf, size_t cap);

#endif
