"""JSON schemas (draft 7) for the Prometheus Operator objects in deploy/k8s, which have no
built-in Kubernetes schema. Written from the operator's API reference (monitoring.coreos.com/v1)
for the fields these manifests use and a few neighbours; anything else is refused
(additionalProperties: false), so a misspelt field fails here as it would be silently ignored,
or refused, by a cluster with the CRDs installed. Extend a schema when the manifests start using
another field of the API.
"""

# The operator's Duration: Prometheus's duration syntax.
DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
               r"(([0-9]+)ms)?)$",
}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
# DNS-1123 subdomain, as for every object name.
NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"}

METADATA = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": NAME,
        "namespace": NAME,
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}


def _object(kind, spec):
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": METADATA,
            "spec": spec,
        },
    }


LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "properties": {
        "matchLabels": STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "operator"],
                "additionalProperties": False,
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}

POD_MONITOR = _object("PodMonitor", {
    "type": "object",
    "required": ["selector", "podMetricsEndpoints"],
    "additionalProperties": False,
    "properties": {
        "selector": LABEL_SELECTOR,
        "namespaceSelector": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "any": {"type": "boolean"},
                "matchNames": {"type": "array", "items": {"type": "string"}},
            },
        },
        "jobLabel": {"type": "string"},
        "podTargetLabels": {"type": "array", "items": {"type": "string"}},
        "podMetricsEndpoints": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["port"],
                "additionalProperties": False,
                "properties": {
                    "port": {"type": "string", "minLength": 1},
                    "path": {"type": "string", "pattern": "^/"},
                    "scheme": {"enum": ["http", "https"]},
                    "interval": DURATION,
                    "scrapeTimeout": DURATION,
                    "honorLabels": {"type": "boolean"},
                },
            },
        },
    },
})

RULE = {
    "type": "object",
    "required": ["expr"],
    "additionalProperties": False,
    "properties": {
        "alert": {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"},
        "record": {"type": "string", "pattern": r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
        "expr": {"anyOf": [{"type": "string", "minLength": 1}, {"type": "integer"}]},
        "for": DURATION,
        "keep_firing_for": DURATION,
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
    # Exactly one of alert and record.
    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
}

PROMETHEUS_RULE = _object("PrometheusRule", {
    "type": "object",
    "required": ["groups"],
    "additionalProperties": False,
    "properties": {
        "groups": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "rules"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "interval": DURATION,
                    "limit": {"type": "integer", "minimum": 0},
                    "partial_response_strategy": {"type": "string"},
                    "rules": {"type": "array", "items": RULE},
                },
            },
        },
    },
})

SCHEMAS = {"PodMonitor": POD_MONITOR, "PrometheusRule": PROMETHEUS_RULE}
