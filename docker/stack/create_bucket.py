"""The stack's one-shot bucket job: the `engines` bucket with versioning and Object Lock
(governance, 30 days), created once; a second run finds it and changes nothing."""

from __future__ import annotations

import sys
import time

import boto3
from botocore.exceptions import ClientError, EndpointConnectionError

BUCKET = "engines"


def main() -> int:
    s3 = boto3.client("s3")
    for _ in range(60):  # SeaweedFS answers its health check before its S3 gateway takes writes
        try:
            s3.head_bucket(Bucket=BUCKET)
            print(f"bucket {BUCKET} exists")
            return 0
        except ClientError as err:
            if err.response["Error"]["Code"] not in ("404", "NoSuchBucket"):
                time.sleep(1)
                continue
            break
        except EndpointConnectionError:
            time.sleep(1)
    s3.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    s3.put_object_lock_configuration(Bucket=BUCKET, ObjectLockConfiguration={
        "ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 30}}})
    print(f"bucket {BUCKET} created with versioning and Object Lock")
    return 0


if __name__ == "__main__":
    sys.exit(main())
