"""S3 errors: a code, a status, and a message a person understands."""

from __future__ import annotations

from ..store.base import StoreError

#: HTTP status of each S3 error code the gateway answers with.
STATUS = {
    "AccessDenied": 403,
    "AuthorizationHeaderMalformed": 400,
    "AuthorizationQueryParametersError": 400,
    "BadDigest": 400,
    "BucketAlreadyExists": 409,
    "BucketAlreadyOwnedByYou": 409,
    "BucketNotEmpty": 409,
    "EntityTooLarge": 400,
    "EntityTooSmall": 400,
    "IllegalLocationConstraintException": 400,
    "IncompleteBody": 400,
    "InternalError": 500,
    "InvalidAccessKeyId": 403,
    "InvalidArgument": 400,
    "InvalidBucketName": 400,
    "InvalidDigest": 400,
    "InvalidPart": 400,
    "InvalidPartNumber": 416,
    "InvalidPartOrder": 400,
    "InvalidURI": 400,
    "InvalidRange": 416,
    "InvalidRequest": 400,
    "KeyTooLongError": 400,
    "MalformedXML": 400,
    "MetadataTooLarge": 400,
    "MethodNotAllowed": 405,
    "MissingContentLength": 411,
    "MissingSecurityHeader": 400,
    "NoSuchBucket": 404,
    "NoSuchKey": 404,
    "NoSuchUpload": 404,
    "NoSuchVersion": 404,
    "NotModified": 304,
    "NotImplemented": 501,
    "PreconditionFailed": 412,
    "RequestTimeout": 400,
    "RequestTimeTooSkewed": 403,
    "ServiceUnavailable": 503,
    "SignatureDoesNotMatch": 403,
    "SlowDown": 503,
    "XAmzContentSHA256Mismatch": 400,
}


class S3Error(Exception):
    """An error answered to an S3 client as XML (or a bare status for HEAD)."""

    def __init__(self, code: str, message: str, status: int | None = None, **extra: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or STATUS.get(code, 400)
        self.extra = extra


def from_exception(exc: BaseException) -> S3Error | None:
    """Translate store, auth and body errors (anything with ``code``) into S3 errors."""
    if isinstance(exc, S3Error):
        return exc
    if isinstance(exc, StoreError):
        return S3Error(exc.code, exc.message)
    code = getattr(exc, "code", None)
    if isinstance(code, str):
        status = getattr(exc, "status", None)
        message = getattr(exc, "message", None) or str(exc)
        return S3Error(code, message, status if isinstance(status, int) else None)
    return None


def not_implemented(what: str) -> S3Error:
    return S3Error("NotImplemented", f"{what} is not implemented by this gateway.")
