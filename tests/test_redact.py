"""Redaction of biography events: planted secrets are replaced, ordinary text is left alone.

Every planted secret is generated at import time from a seeded RNG and split literals, so
this file holds nothing that looks like a real credential (and push-protection scanners stay
quiet). Assertions compare markers and counts; no test prints a secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
import re
import string
import threading

import orjson
import pytest

from gateway.biography.redact import RULE_NAMES, TYPES, Redactor, credential_key

KEY = b"test-deployment-key"
MARKER = re.compile(r"\[REDACTED:([a-z_]+):([0-9a-f]{8})\]")
_R = random.Random(20240601)
ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits


def _rand(n: int, alphabet: str = ALNUM) -> str:
    return "".join(_R.choice(alphabet) for _ in range(n))


def _mix(n: int) -> str:
    """Random alphanumerics that surely mix digits, lower and upper case."""
    return "Zq7" + _rand(n - 3)


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _pem(kind: str = "RSA", lines: int = 8) -> str:
    body = "\n".join(base64.b64encode(_R.randbytes(48)).decode() for _ in range(lines))
    return f"-----BEGIN {kind} PRIVATE KEY-----\n{body}\n-----END {kind} PRIVATE KEY-----"


JWT = ".".join(
    [_b64url(b'{"alg":"HS256","typ":"JWT"}'), _b64url(b'{"sub":"agent-7","exp":1700000000}'),
     _b64url(_R.randbytes(32))]
)  # fmt: skip

#: One fake of each provider token type, keyed by the type its marker must carry.
TOKENS: dict[str, list[str]] = {
    "aws_access_key": ["AK" + "IA" + _rand(16, UPPER_DIGITS), "AS" + "IA" + _rand(16, UPPER_DIGITS)],
    "github_token": ["gh" + "p_" + _mix(36), "gh" + "s_" + _mix(36), "github_" + "pat_" + _mix(22) + "_" + _mix(59)],
    "gitlab_token": ["gl" + "pat-" + _mix(20)],
    "slack_token": ["xo" + "xb-" + _rand(12, string.digits) + "-" + _rand(13, string.digits) + "-" + _mix(24)],
    "stripe_key": ["sk" + "_live_" + _mix(24), "rk" + "_live_" + _mix(24), "sk" + "_test_" + _mix(24)],
    "openai_key": ["sk-" + "proj-" + _mix(64) + "-" + _mix(20), "sk-" + _mix(48)],
    "anthropic_key": ["sk-" + "ant-api03-" + _mix(93) + "AA"],
    "google_api_key": ["AI" + "za" + "Sy" + _mix(33)],
    "jwt": [JWT],
}
WEBHOOK_PATH = "services/T" + _rand(8, UPPER_DIGITS) + "/B" + _rand(8, UPPER_DIGITS) + "/" + _mix(24)
URL_PASSWORD = "Xq9" + _rand(13) + "!"
AWS_SECRET = _mix(20) + "/" + _mix(10) + "+" + _mix(8)
STRONG = ["hunter2-Xq9#vLm4", "Tr0ub4dor&3x", "x7#kPq2!vB" + _rand(4), _mix(32)]


def _types(text: str) -> list[str]:
    return [m.group(1) for m in MARKER.finditer(text)]


@pytest.fixture
def red() -> Redactor:
    return Redactor(KEY)


# --- types and markers ----------------------------------------------------------------------


def test_types_are_listed_for_the_readme():
    assert set(TOKENS) | {"private_key", "url_password", "secret_assignment", "aws_secret_key", "vault"} <= set(
        RULE_NAMES
    )
    assert list(TYPES) == list(RULE_NAMES)


TOKEN_CASES = [(kind, i) for kind, fakes in TOKENS.items() for i in range(len(fakes))]


@pytest.mark.parametrize(("kind", "i"), TOKEN_CASES)
def test_token_in_prose(red, kind, i):
    secret = TOKENS[kind][i]
    out, n = red.redact_text(f"I deployed with {secret} yesterday, then rotated it.")
    assert n == 1 and secret not in out
    assert _types(out) == [kind]
    assert out.startswith("I deployed with [REDACTED:") and out.endswith("] yesterday, then rotated it.")


@pytest.mark.parametrize(("kind", "i"), TOKEN_CASES)
def test_token_in_code(red, kind, i):
    secret = TOKENS[kind][i]
    code = (
        "import client\n\n"
        f'api = client.Client(api_key="{secret}", timeout=30)\n'
        f"headers['X-Custom'] = '{secret}'\n"
        f"export LEGACY={secret}\n"
    )
    out, n = red.redact_text(code)
    assert n == 3 and secret not in out
    assert _types(out) == [kind] * 3  # the provider type wins over secret_assignment
    assert "client.Client(api_key=\"[REDACTED:" in out and "timeout=30" in out


@pytest.mark.parametrize(("kind", "i"), TOKEN_CASES)
def test_token_in_json_data(red, kind, i):
    secret = TOKENS[kind][i]
    data = {"note": f"using {secret} now", "items": [1, secret, None], "nested": {"api_key": secret}}
    out, n = red.redact_json(data)
    assert n == 3 and secret not in json.dumps(out)
    assert _types(json.dumps(out)) == [kind] * 3
    assert out["items"][0] == 1 and out["items"][2] is None and set(out["nested"]) == {"api_key"}
    assert data["items"][1] == secret  # the input is not modified
    raw, n = red.redact_text(json.dumps(data))  # and the same event as raw JSON text
    assert n == 3 and secret not in raw


def test_slack_webhook_keeps_host(red):
    out, n = red.redact_text(f"curl -X POST https://hooks.slack.com/{WEBHOOK_PATH} -d @msg.json")
    assert n == 1 and WEBHOOK_PATH not in out
    assert re.fullmatch(r"curl -X POST https://hooks\.slack\.com/services/\[REDACTED:slack_token:[0-9a-f]{8}\] -d @msg\.json", out)


def test_url_password_keeps_user_and_host(red):
    text = f"DATABASE_URL=postgres://app_user:{URL_PASSWORD}@db.internal:5432/app?sslmode=require"
    out, n = red.redact_text(text)
    assert n == 1 and URL_PASSWORD not in out
    assert re.fullmatch(
        r"DATABASE_URL=postgres://app_user:\[REDACTED:url_password:[0-9a-f]{8}\]@db\.internal:5432/app\?sslmode=require",
        out,
    )
    out, n = red.redact_text(f"redis://:{URL_PASSWORD}@cache:6379/0 and amqp://svc:{URL_PASSWORD}@[::1]:5672")
    assert n == 2 and _types(out) == ["url_password"] * 2 and "redis://:[REDACTED:" in out and "amqp://svc:[" in out


def test_escaped_slashes_hide_neither_webhooks_nor_url_passwords(red):
    """JSON written with ``\\/`` for ``/`` (PHP's json_encode, Slack's own answers): a raw HTTP
    body in a tool result, as text and inside data. Both were stored with no redaction."""
    hook = f"https://hooks.slack.com/{WEBHOOK_PATH}".replace("/", "\\/")
    dsn = f"postgres://admin:{URL_PASSWORD}@db.internal:5432/app".replace("/", "\\/")
    for body in (f'{{"url": "{hook}"}}', f'{{"dsn": "{dsn}"}}'):
        out, n = red.redact_text(f"HTTP/1.1 200 OK\n\n{body}")
        assert n == 1 and WEBHOOK_PATH.rsplit("/", 1)[-1] not in out and URL_PASSWORD not in out, out
        text, n = red.redact_json_text(json.dumps({"body": body}, sort_keys=True))
        assert n == 1 and WEBHOOK_PATH.rsplit("/", 1)[-1] not in text and URL_PASSWORD not in text, text
    assert red.redact_text("C:\\/\\/dir and http:\\/\\/user:pass@host")[1] == 0


def test_url_password_placeholders_stay(red):
    for text in [
        "postgres://user:password@localhost/db",
        "redis://:${REDIS_PASSWORD}@cache:6379",
        "https://user:$TOKEN@github.com/org/repo.git",
        "mysql://root:****@db/app",
        "https://user:pass@example.com/",
        "http://localhost:8080/path@v2",
        "https://example.com:443/a?b=c@d",
    ]:
        assert red.redact_text(text) == (text, 0), text


def test_private_key_block_multiline(red):
    pem = _pem()
    text = f"Here is the key I found:\n{pem}\nand then the build continued."
    out, n = red.redact_text(text)
    assert n == 1 and _types(out) == ["private_key"]
    assert out.startswith("Here is the key I found:\n[REDACTED:private_key:") and out.endswith(
        "]\nand then the build continued."
    )
    assert "PRIVATE KEY" not in out and "MII" not in out


def test_private_key_variants(red):
    openssh, pgp = _pem("OPENSSH"), _pem("PGP").replace("KEY-----", "KEY BLOCK-----")
    escaped = json.dumps({"private_key": _pem("EC")})  # one line with \n escapes, inside JSON text
    truncated = _pem("ENCRYPTED").rsplit("-----END", 1)[0]  # a tool printed only the head
    for text in (openssh, pgp, escaped, truncated):
        out, n = red.redact_text(text)
        assert n == 1 and _types(out) == ["private_key"] and "BEGIN" not in out
    out, n = red.redact_json({"cert": "public", "key": _pem("EC")})
    assert n == 1 and out["key"].startswith("[REDACTED:private_key:")


def test_private_key_edges_keep_surrounding_text(red):
    head = _pem().rsplit("-----END", 1)[0].rstrip()
    out, n = red.redact_text(f"{head}\nand then the build continued with step two\nok")
    assert n == 1 and out.endswith("]\nand then the build continued with step two\nok")
    # a header mentioned in prose does not swallow the text up to a later key's END line
    pem = _pem()
    prose = "Files start with -----BEGIN RSA PRIVATE KEY----- and we never log them.\n"
    out, n = red.redact_text(prose + "Found one:\n" + pem)
    assert n == 1 and out.startswith(prose + "Found one:\n[REDACTED:private_key:")
    body = base64.b64encode(_R.randbytes(48)).decode()
    encrypted = (
        f"-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,{_rand(32, '0123456789ABCDEF')}"
        f"\n\n{body}\n-----END RSA PRIVATE KEY-----"
    )
    assert _types(red.redact_text(encrypted)[0]) == ["private_key"]


def test_private_key_split_over_json_strings(red):
    lines = _pem().split("\n")  # a file read back as a list of lines
    out, n = red.redact_json({"path": "id_rsa", "lines": lines})
    assert n == len(lines) and all(_types(x) == ["private_key"] for x in out["lines"])
    assert out["path"] == "id_rsa" and not any(line in json.dumps(out) for line in lines[1:-1])


def test_pem_markers_in_code_are_not_a_key(red):
    code = (
        'BEGIN = "-----BEGIN RSA PRIVATE KEY-----"\n'
        'END = "-----END RSA PRIVATE KEY-----"\n'
        'if line.startswith("-----BEGIN PRIVATE KEY-----"):\n'
        "    in_key = True\n"
    )
    assert red.redact_text(code) == (code, 0)


def test_aws_secret_key_in_assignments(red):
    for text in [
        f"aws_secret_access_key = {AWS_SECRET}",
        f'AWS_SECRET_ACCESS_KEY="{AWS_SECRET}"',
        f'{{"SecretAccessKey": "{AWS_SECRET}", "AccessKeyId": "{TOKENS["aws_access_key"][0]}"}}',
    ]:
        out, n = red.redact_text(text)
        assert AWS_SECRET not in out and "aws_secret_key" in _types(out)
    out, n = red.redact_json({"Credentials": {"SecretAccessKey": AWS_SECRET, "Expiration": "2025-03-14T09:21:33Z"}})
    assert n == 1 and _types(out["Credentials"]["SecretAccessKey"]) == ["aws_secret_key"]
    assert out["Credentials"]["Expiration"] == "2025-03-14T09:21:33Z"


@pytest.mark.parametrize("value", STRONG)
def test_secret_assignments_are_redacted(red, value):
    for text in [
        f'password = "{value}"',
        f"DB_PASSWORD={value}",
        f"db:\n  password: '{value}'\n  host: db.internal",
        f'{{"client_secret": "{value}", "client_id": "web"}}',
        f'{{\\"apiKey\\": \\"{value}\\"}}',
        f"clientSecret := `{value}`",
        f"mysql -u root --password {value} -h db",
        f"https://api.example.com/v1/items?access_token={value}&page=2",
        f"X-Api-Key: {value}",
    ]:
        out, n = red.redact_text(text)
        assert n == 1 and value not in out and _types(out) == ["secret_assignment"], text
    out, n = red.redact_text(f"Authorization: Bearer {value}\nAccept: application/json")
    assert n == 1 and out.startswith("Authorization: Bearer [REDACTED:secret_assignment:")


def test_basic_auth_header(red):
    creds = base64.b64encode(b"deploy-bot:" + _mix(16).encode()).decode()
    out, n = red.redact_text(f"Authorization: Basic {creds}")
    assert n == 1 and out.startswith("Authorization: Basic [REDACTED:secret_assignment:")
    assert red.redact_text("Authorization: Basic <credentials>")[1] == 0


@pytest.mark.parametrize(
    "text",
    [
        'password = os.environ["X"]',
        "token = get_token()",
        "secret: null",
        "password=...",
        "token: ${TOKEN}",
        'api_key: "<your-token>"',
        "password: xxxx",
        "password: changeme",
        'password = "changeme123"',
        'secret = "********"',
        'token = "YOUR_TOKEN_HERE"',
        "password: '{{ db_password }}'",
        "export GITHUB_TOKEN=$(gh auth token)",
        "token: ${{ secrets.GITHUB_TOKEN }}",
        "password = self._password",
        "password: str = Field(min_length=8)",
        "token: Optional[str] = None",
        "api_key=api_key",
        "secret_key = settings.SECRET_KEY",
        "PWD=/home/agent/work",
        'password: "correct horse battery staple"',
        'token = "abc12"',
        "Authorization: Bearer <token>",
        "Authorization: Bearer $TOKEN",
        "headers = {'Authorization': f'Bearer {token}'}",
        "token_count = 1234567890",
        "max_tokens: 4096",
        "password_field = form.fields['password']",
        "auth: oauth",
        "passwords: []",
        "auth: user=jane",
        "password: 1700000000",
        "secret: prod-db-2024",
        "auth_url = 'https://login.example.com/oauth2/v2.0/authorize'",
        "credentials: ./secrets/dev.json",
        "token = jwt.encode(payload, key, algorithm='HS256')",
        "if password == confirm_password:",
        "mysql --password-file /run/secrets/db --user app",
        # three character classes, not words, but repetitive: only the entropy check rejects these
        "password: Aa1Aa1Aa1Aa1",
        "token = 'ab1!ab1!ab1!ab1!'",
    ],
)
def test_assignment_lookalikes_are_not_redacted(red, text):
    assert red.redact_text(text) == (text, 0)


def test_lessons_from_real_code(red):
    """Shapes met while scanning botocore/awscli/moto docs and the stdlib: left alone."""
    access_key = TOKENS["aws_access_key"][0]
    sigv4 = (
        f"Authorization: AWS4-HMAC-SHA256 Credential={access_key}/20250314/us-east-1/s3/aws4_request, "
        f"SignedHeaders=host;x-amz-date, Signature={hashlib.sha256(b'x').hexdigest()}"
    )
    out, n = red.redact_text(sigv4)  # the access key id is redacted, the scope and scheme stay
    assert n == 1 and _types(out) == ["aws_access_key"] and "/20250314/us-east-1/s3/aws4_request" in out
    quiet = [
        '"Resource": "arn:aws:secretsmanager:*:*:secret:ecr-pullthroughcache/*"',
        "urn:ietf:params:oauth:jwk-thumbprint:sha-256:DCdRGGDKvhAJgmVlCp6tosc2T9",
        '"AWS::ApiGateway::ApiKey": "b899a0d240b53d9d"',
        '"ClientToken": "550e8400-e29b-41d4-a716-446655440000"',
        "aws waf update-rule --change-token 12cs345-67cd-890b-1cd2-c3a4567d89f1",
        '"LockToken": "b0f4583e-998b-4880-9069-3fbe45738b43"',
        '_INCORRECT_PASSPHRASE = "Incorrect passphrase (or the encrypted key is corrupted)"',
        "s3_disable_express_session_auth=s3_disable_express_session_auth,",
        "(commandline --current-token --cut-at-cursor)",
        "<code>otpauth://totp/$name@$account?secret=$Base32String</code>",
        "credentials: Credentials) -> SigV4Auth:",
        "const myURL = new URL('https://abc:xyz@example.com');",
    ]
    for text in quiet:
        assert red.redact_text(text) == (text, 0), text


def test_value_shapes_that_are_secrets(red):
    slash_b64 = "/" + _mix(39)  # base64 may start with "/" without being a path
    hex32 = hashlib.md5(b"x").hexdigest()
    long_value = _mix(6000)  # longer than the 4 KiB window: redacted whole
    for text, value in [(f"token: {slash_b64}", slash_b64), (f"api_key={hex32}", hex32),
                        (f"token={long_value} end", long_value)]:  # fmt: skip
        out, n = red.redact_text(text)
        assert n == 1 and value not in out and _types(out) == ["secret_assignment"]
    assert red.redact_text(f"token={long_value} end")[0].endswith("] end")


@pytest.mark.parametrize(
    "text",
    ["token=" * 10000, "token:" * 10000, "password: " * 5000, "--password " * 5000, "://" * 20000,
     "-----BEGIN RSA PRIVATE KEY-----\n" * 2000, "sk-" * 20000, "[REDACTED:" * 10000,
     ('token="' + "a" * 5000 + "\n") * 10],
)  # fmt: skip
def test_pathological_repetition_is_left_alone(red, text):
    """Dense triggers with nothing secret: each candidate costs a bounded amount of work."""
    assert red.redact_text(text) == (text, 0)


def test_paging_cursors_are_not_credentials(red):
    cursor = _mix(40) + "="
    data = {"NextContinuationToken": cursor, "NextToken": cursor, "page_token": cursor, "KeyCount": 2}
    assert red.redact_json(data) == (data, 0)
    assert red.redact_text(json.dumps(data)) == (json.dumps(data), 0)


def test_json_credential_keys(red):
    data = {
        "password": "x7#kPq2!vB",
        "api_key": "changeme",
        "token": None,
        "token_count": _mix(40),
        "secret_name": _mix(40),
        "Authorization": "Bearer " + _mix(40),
        "auth": {"username": "jane", "password": "Tr0ub4dor&3x"},
        "author": "Jane Doe",
    }
    out, n = red.redact_json(data)
    assert n == 3
    assert _types(out["password"]) == ["secret_assignment"] and out["password"].startswith("[REDACTED:")
    assert out["Authorization"].startswith("Bearer [REDACTED:secret_assignment:")
    assert _types(out["auth"]["password"]) == ["secret_assignment"] and out["auth"]["username"] == "jane"
    for k in ("api_key", "token", "token_count", "secret_name", "author"):
        assert out[k] == data[k]
    assert list(out) == list(data)  # keys kept, in order


def test_credential_key_names():
    for key in ["password", "DB_PASSWORD", "clientSecret", "X-Api-Key", "api_key", "apiKey", "access_token",
                "refresh_token", "Authorization", "aws_secret_access_key", "SecretAccessKey", "passphrase",
                "credentials", "auth", "github_token"]:  # fmt: skip
        assert credential_key(key), key
    for key in ["token_count", "max_tokens", "password_field", "secret_name", "author", "tokenizer", "auth_method",
                "NextToken", "ContinuationToken", "key", "token_type", "tokens", "passwordHash"]:  # fmt: skip
        assert not credential_key(key), key


# --- counting, idempotence, keyed hashes ----------------------------------------------------


def _mixed_document() -> str:
    pem = _pem()
    parts = [f"step {i}: used {fakes[0]}" for i, fakes in enumerate(TOKENS.values())]
    parts += [pem, f"postgres://u:{URL_PASSWORD}@h/db", f'password = "{STRONG[0]}"', f"aws_secret_access_key={AWS_SECRET}"]
    return "\n".join(parts) + "\nend of log"


def test_count_is_the_number_of_markers(red):
    doc = _mixed_document()
    out, n = red.redact_text(doc)
    assert n == len(TOKENS) + 4 == len(_types(out))
    assert sorted(set(_types(out))) == sorted(set(TOKENS) | {"private_key", "url_password", "secret_assignment", "aws_secret_key"})
    assert out.endswith("\nend of log")


def test_redaction_is_idempotent(red):
    red.add_values(["vault-" + _mix(20)])
    docs = [_mixed_document(), "vault value " + red._values.values[0] + " here"]
    docs += [f"{k}: {v[0]}" for k, v in TOKENS.items()]
    for doc in docs:
        once, n = red.redact_text(doc)
        assert n >= 1
        assert red.redact_text(once) == (once, 0)
        data, n = red.redact_json({"a": doc, "password": STRONG[1]})
        assert red.redact_json(data) == (data, 0)
    marker_lines = "\n".join(
        f"{k}: [REDACTED:{kind}:0123abcd]" for k in ("token", "password", "api_key", "secret") for kind in RULE_NAMES
    )
    assert red.redact_text(marker_lines) == (marker_lines, 0)


def test_keyed_hash(red):
    secret = TOKENS["github_token"][0]
    out1, _ = red.redact_text(f"a {secret} b {secret}")
    out2, _ = Redactor(KEY).redact_text(f"c {secret}")
    other, _ = Redactor(b"another-deployment").redact_text(f"c {secret}")
    expected = hmac.new(KEY, secret.encode(), hashlib.sha256).hexdigest()[:8]
    assert [m.group(2) for m in MARKER.finditer(out1)] == [expected, expected]
    assert MARKER.search(out2).group(2) == expected
    assert MARKER.search(other).group(2) != expected
    with pytest.raises(ValueError):
        Redactor(b"")


# --- exact values (vault) -------------------------------------------------------------------


def test_add_values(red):
    long_value, short_prefix = "vault-" + _mix(24), None
    short_prefix = long_value[:12]
    red.add_values([short_prefix, long_value, "short", ""])
    text = f"a {long_value} b {short_prefix}c and short words stay short"
    out, n = red.redact_text(text)
    assert n == 2 and _types(out) == ["vault", "vault"] and long_value not in out and short_prefix not in out
    assert "short words stay short" in out
    # longest first: the long value is one marker, not a marker for its prefix plus a tail
    assert out.startswith("a [REDACTED:vault:") and "] b [REDACTED:vault:" in out
    assert red.marker("vault", long_value) in out
    data, n = red.redact_json({"out": f"echo {long_value}", "n": 1})
    assert n == 1 and long_value not in data["out"]


def test_vault_values_are_found_as_json_spells_them(red):
    """Tool output is often json.dumps of a dict: non-ASCII comes as \\u00fc, and some
    serializers write "/" as \\/. The value is redacted in those spellings too."""
    import json

    password, url = "Zürich-Prod-DB-pw-9931", "https://x/abc/def/ghi-secret-77"
    red.add_values([password, url])
    for text in (json.dumps({"note": password}), json.dumps({"u": url}).replace("/", "\\/"),
                 json.dumps({"note": password}, ensure_ascii=False)):
        out, n = red.redact_text(text)
        assert n == 1 and _types(out) == ["vault"], text
        assert "rich-Prod-DB" not in out and "ghi-secret" not in out
    marked = red.redact_text(json.dumps({"note": password}))[0]
    assert red.marker("vault", password) in marked  # the marker of the value itself
    data, n = red.redact_json_text(json.dumps({"out": json.dumps({"pw": password})}))
    assert n == 1 and "rich-Prod-DB" not in data


def test_vault_values_win_over_patterns_and_are_idempotent(red):
    token = TOKENS["github_token"][0]
    red.add_values([token, "12345678"])
    out, n = red.redact_text(f"token {token} and [REDACTED:jwt:12345678]")
    assert n == 1 and _types(out) == ["vault", "jwt"]
    assert red.redact_text(out) == (out, 0)


def test_add_values_is_thread_safe():
    red = Redactor(KEY)
    values = [f"val-{i:03d}-" + _mix(12) for i in range(40)]
    text = " ".join(values)
    errors: list[BaseException] = []

    def add(chunk: list[str]) -> None:
        try:
            for v in chunk:
                red.add_values([v])
                red.redact_text(text)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=add, args=(values[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    out, n = red.redact_text(text)
    assert n == len(values) and _types(out) == ["vault"] * len(values)


# --- no false positives ---------------------------------------------------------------------

PROSE = """
The agent reviewed the deployment plan and noticed that the token budget for the summarization
step was too small, so it raised max_tokens to 4096 and re-ran the evaluation. Authentication
failed twice because the session had expired; the author of the runbook suggests rotating
credentials every ninety days. Our secret sauce is careful testing: every password field in the
signup form is validated on the client and on the server. The tokenizer splits words into subword
units, and the token count grows with the length of the prompt.
Password: must be at least twelve characters long and must not reuse the last five passwords.
Secret: nobody outside the team knows the launch date yet. Token: the smallest unit of text.
Please don't paste your API key or any credentials into the chat; use the vault instead.
Antidisestablishmentarianism, pneumonoultramicroscopicsilicovolcanoconiosis and
internationalization are long words; so is Supercalifragilisticexpialidocious.
The risk-adjusted-return model for 2024 and the task-runner-configuration were reviewed by
jane.doe@example.com and ops+alerts@corp.example.org on 2025-03-14T09:21:33Z.
"""

PYTHON = '''
import os
from dataclasses import dataclass


@dataclass
class LoginForm:
    username: str
    password_field: str = "password"
    token_count: int = 0


def get_secret(name: str) -> str:
    """Fetch a secret from the vault by name; never log it."""
    secret_name = f"prod/{name}"
    return vault.read(secret_name)


def login(form: LoginForm) -> Session:
    password = os.environ["APP_PASSWORD"]
    token = get_token()
    api_key = os.getenv("API_KEY", "")
    auth_header = {"Authorization": f"Bearer {token}"}
    if not password:
        raise ValueError("password missing")
    tokens = tokenizer.encode(form.username)
    token_count = len(tokens)
    secret = None
    return Session(token=token, headers=auth_header, api_key=api_key)
'''

GO = '''
type Config struct {
	User     string `json:"user"`
	Password string `json:"password"`
	APIKey   string `json:"api_key" env:"API_KEY"`
}

func Load() (*Config, error) {
	token := os.Getenv("GITHUB_TOKEN")
	secret, err := vault.Get(ctx, "db/password")
	if err != nil {
		return nil, fmt.Errorf("load secret: %w", err)
	}
	password := string(secret)
	return &Config{User: "app", Password: password, APIKey: token}, nil
}
'''

JS = '''
export async function fetchUser(id, { signal } = {}) {
  const token = await getAccessToken();
  const apiKey = process.env.API_KEY;
  const res = await fetch(`https://api.example.com/v1/users/${id}`, {
    headers: { Authorization: `Bearer ${token}`, "X-Api-Key": apiKey },
    signal,
  });
  const passwordInput = document.querySelector("#password");
  passwordInput.type = "password";
  return res.json();
}
'''

SHELL = """
$ git log --oneline -3
3f2c1e9 fix: handle empty token list
9b8a7c6 feat: rotate credentials on schedule
$ git rev-parse HEAD
3f2c1e9a4b5d6e7f8091a2b3c4d5e6f708192a3b
$ sha256sum dist/orgmem-1.4.2.tar.gz
9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  dist/orgmem-1.4.2.tar.gz
$ ls /var/lib/orgmem/data/agent=build-7/date=2025-03-14/
segment-550e8400-e29b-41d4-a716-446655440000.parquet  segment-6ba7b810-9dad-11d1-80b4-00c04fd430c8.parquet
$ curl -s https://admin@orgmem.internal:9000/health http://localhost:8080/ http://[::1]:9000/x
{"status":"ok","version":"1.4.2","build":"v2.0.0-rc.1+sha.3f2c1e9"}
$ git clone ssh://git@github.com:22/org/repo.git && git clone git@github.com:org/repo.git
$ pwd
/home/agent/work
$ gh auth token >/dev/null && echo ok
$ pytest -q tests/test_api.py
........................................
40 passed in 3.21s
$ export PATH=/usr/local/bin:$PATH HOME=/home/agent
PWD=/home/agent/work OLDPWD=/home/agent LANG=C.UTF-8
"""

CONFIG = """
apiVersion: v1
kind: Secret
type: Opaque
metadata:
  name: db-credentials
---
env:
  - name: DB_PASSWORD
    valueFrom:
      secretKeyRef:
        name: db-credentials
        key: password
services:
  db:
    environment:
      POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:-postgres}
      POSTGRES_USER: app
steps:
  - uses: actions/checkout@v4
    with:
      token: ${{ secrets.GITHUB_TOKEN }}
.button { color: #1f2937; background-color: #FFF; border: 1px solid #e5e7eb; }
"""

DATA_URI = "data:image/png;base64," + base64.b64encode(random.Random(7).randbytes(3000)).decode()

FALSE_POSITIVE_TEXTS = {
    "prose": PROSE,
    "python": PYTHON,
    "go": GO,
    "js": JS,
    "shell": SHELL,
    "config": CONFIG,
    "data_uri": f'<img src="{DATA_URI}" alt="chart">',
    "hex_and_ids": " ".join(
        [hashlib.sha256(str(i).encode()).hexdigest() for i in range(20)]
        + [hashlib.sha1(str(i).encode()).hexdigest() for i in range(20)]
        + [str(random.Random(i).getrandbits(128)) for i in range(5)]
        + ["1.2.3", "v10.4.0-beta.2", "2025-03-14T09:21:33.123456+00:00", "#a1b2c3", "rgb(10, 20, 30)"]
    ),
}


@pytest.mark.parametrize("name", FALSE_POSITIVE_TEXTS)
def test_no_false_positives_in_text(red, name):
    text = FALSE_POSITIVE_TEXTS[name]
    out, n = red.redact_text(text)
    assert n == 0, _types(out)
    assert out == text


def test_no_false_positives_in_json(red):
    event = {
        "type": "tool_result",
        "content": PROSE,
        "data": {
            "tool": "bash",
            "input": {"command": "pytest -q", "cwd": "/work/app"},
            "output": SHELL,
            "files": {"src/app.py": PYTHON, "main.go": GO, "web.js": JS, "deploy.yaml": CONFIG},
            "usage": {"input_tokens": 1234, "output_tokens": 56, "cache_read_input_tokens": 0},
            "token_count": 42,
            "tokenizer": "cl100k_base",
            "token_type": "Bearer",
            "password": "",
            "secret": None,
            "api_key": "${API_KEY}",
            "auth_method": "oauth2",
            "author": "Jane Doe",
            "commit": hashlib.sha1(b"x").hexdigest(),
            "ids": ["550e8400-e29b-41d4-a716-446655440000"],
            "image": DATA_URI,
            "links": ["https://user@example.com/a", "mailto:jane.doe@example.com", "file:///tmp/x.txt"],
        },
    }
    out, n = red.redact_json(event)
    assert n == 0 and out is event


def test_nothing_is_printed_or_logged(red, capsys, caplog):
    red.add_values(["vault-" + _mix(20)])
    red.redact_text(_mixed_document())
    red.redact_json({"password": STRONG[0], "doc": _mixed_document()})
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "" and not caplog.records


def test_json_text_redaction_agrees_with_the_walk():
    r = Redactor(b"k" * 32)
    token = "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
    cases = [{"plain": "nothing here", "n": 3}, {"password": "Xq9#kP2-vLm8zR4!"},
             {"nested": [{"header": f"token {token}"}]}, {"apiKey": "sk-" + "A1b2C3d4" * 6}, ["just", "words"]]
    for value in cases:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
        walked, hits = r.redact_json(value)
        got, got_hits = r.redact_json_text(text)
        assert got_hits == hits
        assert orjson.loads(got) == walked
    r.add_values(["correct-horse-battery"])
    assert r.redact_json_text('{"note":"correct-horse-battery"}')[1] == 1


def _all_candidates(text: str, nested_only: bool) -> list[tuple[int, int]]:
    """Every rule scanned, as before the trigger prefilter existed."""
    from gateway.biography import redact

    raw, low = redact._views(text)
    return redact._candidates(text, nested_only, (raw, low, set(range(len(redact.RULES)))))


def test_every_rule_has_triggers():
    """The one-pass prefilter covers every rule: ``--password VALUE``, whose scanner starts
    with ``--`` (which ordinary Markdown and shell are full of), is woken by the credential
    keywords every flag it takes contains."""
    from gateway.biography import redact

    assert not redact._TRIGGERS.always
    flag = next(r for r in redact.RULES if r.contains)
    assert {"passw", "token", "secret", "api", "pwd"} <= set(redact._triggers(flag))
    red = Redactor(KEY)
    for text in (f"run --db-password {STRONG[0]} now", f"--API-KEY {STRONG[3]}", f"x --token {STRONG[1]}"):
        assert red.redact_text(text)[1] == 1


@pytest.mark.parametrize("nested_only", [False, True])
def test_trigger_prefilter_finds_what_the_full_scan_finds(nested_only):
    """On every planted secret, look-alike and odd text of this file (also upper-cased and
    with a non-ASCII character, which switches the scan to bytes), skipping the rules whose
    trigger is absent loses no candidate."""
    from gateway.biography import redact

    texts = [fake for fakes in TOKENS.values() for fake in fakes] + list(STRONG)
    texts += [f"password = {v}" for v in STRONG] + [f'{{"Api-Key": "{_mix(24)}"}}', "x://u:p@h"]
    texts += [f"--db-password {v}" for v in STRONG] + [f"cmd --Api-Key {_mix(24)} -- --token\t{_mix(30)}"]
    texts += [t for t in FALSE_POSITIVE_TEXTS.values() if isinstance(t, str)]
    for text in list(texts):
        texts += [text.upper(), "é " + text, f"prose before {text} and after"]
    for text in texts:
        assert redact._candidates(text, nested_only) == _all_candidates(text, nested_only)


def test_one_trigger_pass_over_many_texts_wakes_what_one_per_text_does():
    """A batch's texts are searched for triggers in one call (the search lets go of the GIL,
    once per batch rather than per text): each text wakes exactly the rules it wakes alone,
    and a trigger split over two neighbouring texts ("pass" + "word") wakes nothing."""
    from gateway.biography import redact

    texts = [fake for fakes in TOKENS.values() for fake in fakes] + list(STRONG)
    texts += [t for t in FALSE_POSITIVE_TEXTS.values() if isinstance(t, str)]
    texts += ["", "é " + texts[0], texts[1].upper(), "glpat", "-", "pass", "word", "ghp", "_"]
    batch = redact.scan_views_each(texts)
    assert batch == [redact._scan_views(text) for text in texts]
    assert redact.scan_views_each(["pass", "word"])[0][2] == redact._scan_views("pass")[2]


def test_redaction_with_a_batch_trigger_pass_equals_redaction_alone(red):
    """The views a batch pass made give the same redaction as none (content and data), also
    when a vault value changed the text before the rules ran."""
    from gateway.biography import redact

    value = "vault-" + _mix(20)
    red.add_values([value])
    texts = [f"use {fake} here" for fakes in TOKENS.values() for fake in fakes]
    texts += [f"{value} and {TOKENS['github_token'][0]}", "nothing to see"]
    datas = [orjson.dumps({"k": t, "password": _mix(16)}, option=orjson.OPT_SORT_KEYS).decode()
             for t in texts]
    views = redact.scan_views_each(texts + datas)
    for i, text in enumerate(texts):
        assert red.redact_text(text, views[i]) == red.redact_text(text)
        assert red.redact_json_text(datas[i], views[len(texts) + i]) == red.redact_json_text(datas[i])


def test_header_pairs_are_keyed_by_their_name(red):
    """HTTP clients log headers as [name, value] pairs: the value of a credential-named header
    is judged as if assigned to that name (the scheme word stays readable); other pairs, and
    ordinary words paired with a credential word, stay."""
    bearer = _mix(40)
    data = {"request": {"headers": [["Authorization", f"Bearer {bearer}"], ["Accept", "application/json"],
                                    ["X-Api-Key", STRONG[3]]]},
            "pairs": [["token", "bucket"], ["secret", "hello world"], ["a", "b"]]}
    out, n = red.redact_json(data)
    assert n == 2
    auth, accept, key = out["request"]["headers"]
    assert auth[0] == "Authorization" and auth[1].startswith("Bearer [REDACTED:") and bearer not in auth[1]
    assert accept == ["Accept", "application/json"] and MARKER.fullmatch(key[1])
    assert out["pairs"] == data["pairs"]
    text = orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode()
    redacted, count = red.redact_json_text(text)
    assert count == 2 and bearer not in redacted and STRONG[3] not in redacted


def test_named_values_are_keyed_by_their_name(red):
    """Kubernetes and CI configs list variables as {"name": ..., "value": ...}, and a
    {"value": ...} under a credential key is that credential's value: both are judged as
    assigned to the name. Placeholders, references and ordinary variables stay."""
    secret = _mix(36)
    data = {"env": [{"name": "DB_PASSWORD", "value": secret}, {"name": "LOG_LEVEL", "value": "debug"},
                    {"name": "API_TOKEN", "value": "${API_TOKEN}"}, {"key": "API_KEY", "value": STRONG[3]}],
            "password": {"value": STRONG[0], "type": "string"},
            "stats": {"name": "token_count", "value": "42"}, "plain": {"value": _mix(36)}}
    out, n = red.redact_json(data)
    assert n == 3
    assert MARKER.fullmatch(out["env"][0]["value"]) and MARKER.fullmatch(out["env"][3]["value"])
    assert out["env"][1:3] == data["env"][1:3] and out["env"][0]["name"] == "DB_PASSWORD"
    assert MARKER.fullmatch(out["password"]["value"]) and out["password"]["type"] == "string"
    assert out["stats"] == data["stats"] and out["plain"] == data["plain"]
    text, count = red.redact_json_text(orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode())
    assert count == 3 and secret not in text and STRONG[0] not in text
