"""Constrained wire types shared by the spec models.

Strict types, so that a float or a quoted number where an integer belongs is an error
(the CRD's OpenAPI schema rejects the same documents).
"""

from typing import Annotated

from pydantic import Field, StrictInt, StrictStr

# DNS-1123 label: pool names become part of child object names.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A Kubernetes qualified name with an optional DNS-subdomain prefix, e.g. mthreads.com/gpu.
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|Ei|M|G|T|P|E)?$"

PoolName = Annotated[StrictStr, Field(min_length=1, max_length=32, pattern=DNS_LABEL_PATTERN)]
ShortText = Annotated[StrictStr, Field(max_length=253)]
LabelKey = Annotated[StrictStr, Field(min_length=1, max_length=317, pattern=QUALIFIED_NAME_PATTERN)]
LabelValue = Annotated[StrictStr, Field(max_length=63)]
Quantity = Annotated[StrictStr, Field(min_length=1, max_length=32, pattern=QUANTITY_PATTERN)]
Replicas = Annotated[StrictInt, Field(ge=0, le=1000)]
Milliseconds = Annotated[StrictInt, Field(ge=1, le=3_600_000)]
Seconds = Annotated[StrictInt, Field(ge=0, le=86_400)]
