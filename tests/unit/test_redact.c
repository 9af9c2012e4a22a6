/* common/redact.c: what is hidden from the event log, usage errors and error
 * files, and what is left as it is.
 * timeout: 10 */
#include "redact.h"
#include "tap.h"

static void hides(const char *prev, const char *in, const char *want)
{
    char out[512];
    int hidden = mg_redact_arg(prev, in, out, sizeof(out));
    is_str(out, want, "%s%s%s", prev ? prev : "", prev ? " " : "", in);
    ok(hidden == (strcmp(in, want) != 0), "  said whether it hid something");
}

int main(void)
{
    /* URLs: the password, or a userinfo without one */
    hides(NULL, "http://user:pw@host/b/", "http://user:***@host/b/");
    hides(NULL, "https://ghp_abc@github.com/x.git", "https://***@github.com/x.git");
    hides(NULL, "--upload=http://u:p@[::1]:8080/x", "--upload=http://u:***@[::1]:8080/x");
    hides(NULL, "curl -T {} https://a:b@h/ && echo http://c:d@e",
          "curl -T {} https://a:***@h/ && echo http://c:***@e");
    hides(NULL, "http://host/path@not-userinfo", "http://host/path@not-userinfo");
    hides(NULL, "s3://bucket/prefix", "s3://bucket/prefix");
    /* NAME=VALUE with a secret's name */
    hides(NULL, "AWS_SECRET_ACCESS_KEY=abc/def", "AWS_SECRET_ACCESS_KEY=***");
    hides(NULL, "token=s3cret,join_timeout=60", "token=***,join_timeout=60");
    hides(NULL, "--password=hunter2", "--password=***");
    hides(NULL, "https://h/x?api_key=zz&n=1", "https://h/x?api_key=***&n=1");
    hides(NULL, "Authorization: Bearer eyJabc.def", "Authorization: Bearer ***");
    /* quoted values, JSON, and digits that are a password */
    hides(NULL, "password='hunter2' next", "password='***' next");
    hides(NULL, "bash -c 'HF_TOKEN=\"hf_abc\" python x.py'",
          "bash -c 'HF_TOKEN=\"***\" python x.py'");
    hides(NULL, "{\"token\": \"abc\", \"n\": 1}", "{\"token\": \"***\", \"n\": 1}");
    hides(NULL, "{\"max_tokens\": 2048}", "{\"max_tokens\": 2048}");
    hides(NULL, "--password=12345678", "--password=***");
    hides("--password", "12345678", "***");
    hides(NULL, "max_tokens=2048", "max_tokens=2048");
    hides(NULL, "at 12:30:01", "at 12:30:01");
    /* flags naming a secret, their value the next argument */
    hides("--token", "abc123", "***");
    hides("--hf-token", "hf_xyz", "***");
    hides("--max_tokens", "512", "512");
    hides("--max_tokens=512", "abc", "abc");
    hides("--token", "--next", "--next");
    /* what is not a secret */
    hides(NULL, "--key=/etc/tls/client.key", "--key=/etc/tls/client.key");
    hides(NULL, "PWD=/home/u", "PWD=/home/u");
    hides(NULL, "--lr=0.1", "--lr=0.1");
    hides(NULL, "user@host", "user@host");
    hides(NULL, "", "");

    /* in place, in a buffer that a longer result must not overflow */
    char buf[24] = "http://u:p@h/";
    mg_redact_inplace(buf, sizeof(buf));
    is_str(buf, "http://u:***@h/", "in place");
    char small[16] = "http://u:p@hos/";
    mg_redact_inplace(small, sizeof(small));
    ok(strstr(small, ":p@") == NULL && strlen(small) < sizeof(small), "in place, cut: %s", small);
    return done_testing();
}
