"""The pod's Open Inference Protocol (KServe v2) routes and its OpenAPI document, as a client sees them.

Same fake build and loopback uvicorn as tests/unit/test_serving.py (no compile); the fake manifest
gets the real records the metadata reads (a ChunkProgram, a Platform). The OpenAPI checks derive
both sides from code: the document from the running app, the accepted fields from the request
model and the parser itself, the paths from the app's routes, the codes from ``CODES``; so an edit
to one that the other does not follow fails here.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import re

import pytest

from avatar_release.records import ChunkProgram, Platform
from tests.serving_fakes import FPS, SPF, SR, H, W, fake_build, post_render

MAX_SECONDS = 20.0  # the serve fixture's Limits(max_seconds=20)


def _as_built(build):
    """The fake build with the manifest fields a real one has and the metadata reads."""
    build.manifest.program = ChunkProgram(
        stages=["audio", "dit", "vae"],
        image_input="ref_image",
        audio_input="speech",
        noise_input="noise",
        carry={},
        deliver="frames",
        fps=FPS,
        sample_rate=SR,
        samples_per_frame=SPF,
        height=H,
        width=W,
    )
    build.manifest.platform = Platform(
        backend="cpu", platform_version="test", device_kind="cpu", device_count=1, mesh_axes=["data"], mesh_shape=[1]
    )
    return build


@pytest.fixture
def pod_at(serve):
    """pod_at(**AppConfig) -> (port, pod): the app on loopback, serving the fake build as built."""

    def start(**cfg):
        port, pod, _ = serve(**cfg)
        _as_built(pod.build)
        return port, pod

    return start


def _get(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(method, path)
    r = c.getresponse()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()


def _json(port: int, path: str) -> tuple[int, object]:
    status, headers, body = _get(port, path)
    assert headers["content-type"] == "application/json", (path, headers)
    return status, json.loads(body)


def _conforms(doc: dict, schema: dict, instance: object) -> None:
    """``instance`` is valid under ``schema`` (a schema of ``doc``, its refs resolved against it), where
    jsonschema is installed (the test extra's check-jsonschema brings it)."""
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.Draft202012Validator({**schema, "components": doc["components"]}).validate(instance)


def _response_schema(doc: dict, path: str, status: int, method: str = "get") -> dict:
    return doc["paths"][path][method]["responses"][str(status)]["content"]["application/json"]["schema"]


# ------------------------------------------------------------------------------------- health


def test_oip_health_says_what_livez_and_readyz_say_when_ready_not_ready_and_draining(pod_at):
    from avatar_release.serving._probes import ProbeServer

    port, pod = pod_at()
    probes = ProbeServer(pod, "127.0.0.1", 0)  # the kubelet's port answers the OIP names too
    probe_port = probes.start()[1]
    try:

        def answers(p: int) -> dict:
            return {path: _json(p, path) for path in ("/v2/health/live", "/v2/health/ready", "/readyz")}

        for p in (port, probe_port):
            got = answers(p)
            assert got["/v2/health/live"] == (200, {"live": True})
            assert got["/v2/health/ready"] == (200, {"ready": True})
            assert got["/readyz"][0] == 200
        assert _json(port, "/v2/models/tiny/ready") == (200, {"name": "tiny", "versions": ["fake-1"], "ready": True})

        pod.build.guard.count = 1  # not ready: the build compiled while serving
        for p in (port, probe_port):
            got = answers(p)
            assert got["/v2/health/live"] == (200, {"live": True})  # alive: not a restart, only out of the Service
            assert got["/v2/health/ready"] == (503, {"ready": False})
            assert got["/readyz"][0] == 503 and got["/readyz"][1]["error"] == "not_ready"
        assert _json(port, "/v2/models/tiny/ready") == (503, {"name": "tiny", "versions": ["fake-1"], "ready": False})

        pod.build.guard.count = 0
        pod.draining = True  # after SIGTERM
        for p in (port, probe_port):
            got = answers(p)
            assert got["/v2/health/live"] == (200, {"live": True})
            assert got["/v2/health/ready"] == (503, {"ready": False})
            assert got["/readyz"][0] == 503 and got["/readyz"][1]["error"] == "draining"
        assert _json(port, "/v2/models/tiny/ready")[0] == 503
    finally:
        probes.close()


# ------------------------------------------------------------------------------------- metadata


def test_server_and_model_metadata_name_the_pipeline_and_the_build_served(pod_at):
    from avatar_release import __version__

    port, pod = pod_at()
    assert _json(port, "/v2") == (200, {"name": "avatar-release", "version": __version__, "extensions": []})
    status, meta = _json(port, "/v2/models/tiny")
    assert status == 200
    assert (meta["name"], meta["versions"], meta["platform"]) == ("tiny", ["fake-1"], "avatar-release/cpu")
    assert (meta["build_id"], meta["digest"], meta["channel"], meta["target"]) == (
        "fake-1",
        pod.build.digest,
        "dev",
        "cpu-8",
    )
    assert meta["fps"] == FPS and meta["buckets"] == {"f8": 8, "f4": 4}
    inputs = {t["name"]: t for t in meta["inputs"]}
    assert list(inputs) == ["image", "audio", "seed", "seconds"]
    assert inputs["image"]["parameters"]["decoded"] == {"name": "ref_image", "datatype": "UINT8", "shape": [H, W, 3]}
    assert inputs["audio"]["parameters"]["decoded"]["sample_rate"] == SR
    assert inputs["audio"]["parameters"]["max_seconds"] == inputs["seconds"]["parameters"]["max"] == MAX_SECONDS
    assert (inputs["seed"]["datatype"], inputs["seed"]["parameters"]["noise_recipe"]) == (
        "INT64",
        "numpy-pcg64-standard-normal/v1",
    )
    [video] = meta["outputs"]
    assert video["name"] == "video" and video["parameters"]["content_type"] == "video/mp4"
    assert video["parameters"]["frames"]["shape"] == [-1, H, W, 3]
    doc = _json(port, "/openapi.json")[1]
    _conforms(doc, _response_schema(doc, "/v2/models/{name}", 200), meta)
    _conforms(doc, _response_schema(doc, "/v2", 200), _json(port, "/v2")[1])

    pod.build = _as_built(fake_build("fake-2"))  # a followed channel swapped builds: the version follows
    assert _json(port, "/v2/models/tiny")[1]["versions"] == ["fake-2"]
    assert _json(port, "/v2/models/tiny/ready")[1]["versions"] == ["fake-2"]


def test_an_unknown_model_name_is_a_404_in_the_pods_error_shape(pod_at):
    port, pod = pod_at()
    doc = _json(port, "/openapi.json")[1]
    for path in ("/v2/models/other", "/v2/models/other/ready", "/v2/models/fake-1"):  # a build id is not a model
        status, body = _json(port, path)
        assert status == 404 and set(body) == {"error", "message"} and body["error"] == "not_found", body
        assert "'tiny'" in body["message"]  # it says what this pod serves
        _conforms(doc, _response_schema(doc, "/v2/models/{name}", 404), body)


# ------------------------------------------------------------------------------------- OpenAPI


def _check_structure_by_hand(doc: dict) -> None:
    """What the validator would check first, for where it is not installed: required fields, every ref resolves."""
    assert {"openapi", "info", "paths"} <= set(doc) and {"title", "version"} <= set(doc["info"])
    for path, item in doc["paths"].items():
        assert path.startswith("/")
        for op in item.values():
            assert op["responses"] and all(re.fullmatch(r"[1-5]\d\d|default", s) for s in op["responses"])
            for s, resp in op["responses"].items():
                assert "description" in resp, (path, s)

    def refs(node: object) -> list[str]:
        if isinstance(node, dict):
            return [v for k, v in node.items() if k == "$ref"] + [r for v in node.values() for r in refs(v)]
        return [r for v in node for r in refs(v)] if isinstance(node, list) else []

    for ref in refs(doc):
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in doc["components"]["schemas"], ref


def test_the_openapi_document_is_openapi_3_1_and_describes_render_as_the_pod_answers(pod_at):
    from avatar_release.serving import CODES, Pod, create_app

    port, pod = pod_at()
    status, headers, body = _get(port, "/openapi.json")
    assert status == 200 and headers["content-type"] == "application/json"
    doc = json.loads(body)
    assert doc["openapi"].startswith("3.1.")
    _check_structure_by_hand(doc)
    try:
        from openapi_spec_validator import OpenAPIV31SpecValidator
    except ImportError:
        pass  # structure checked by hand above
    else:
        OpenAPIV31SpecValidator(doc).validate()

    # every route of the app is documented, with its methods, and nothing else is
    app = create_app(Pod(None, "dev", _as_built(fake_build())))
    routes = {r.path: {m.lower() for m in r.methods} - {"head"} for r in app.routes}
    assert {p: set(item) for p, item in doc["paths"].items()} == routes

    render = doc["paths"]["/render"]["post"]
    assert set(render["requestBody"]["content"]) == {"application/json", "multipart/form-data"}
    ok = render["responses"]["200"]
    assert set(ok["content"]) == {"video/mp4"} and {"X-Build-Id", "X-Frames", "X-Request-Id"} <= set(ok["headers"])
    # each documented error has the status CODES gives it; the Error schema names every code there is
    assert set(doc["components"]["schemas"]["Error"]["properties"]["error"]["enum"]) == set(CODES)
    documented = {}
    for path, item in doc["paths"].items():
        for op in item.values():
            for s, resp in op["responses"].items():
                schema = resp.get("content", {}).get("application/json", {}).get("schema", {})
                for part in schema.get("allOf", []):
                    for code in part.get("properties", {}).get("error", {}).get("enum", []):
                        assert CODES[code] == int(s), (path, s, code)
                        documented.setdefault(path, set()).add(code)
    assert {
        "invalid_json",
        "invalid_request",
        "invalid_image",
        "invalid_audio",
        "duration_too_long",
        "body_too_large",
        "body_timeout",
        "unsupported_media_type",
        "queue_full",
        "queue_timeout",
        "draining",
        "render_failed",
        "render_timeout",
    } <= documented["/render"]
    assert {"400", "408", "413", "415", "429", "500", "503", "504"} <= set(render["responses"])
    assert all("Retry-After" in render["responses"][s]["headers"] for s in ("429", "503"))
    assert documented["/v2/models/{name}"] == {"not_found"}
    # what the pod answers conforms: a JSON error of /render, the draining 503 with its Retry-After
    r, data = post_render(port, b'{"seconds": NaN}')
    _conforms(doc, _response_schema(doc, "/render", 400, "post"), json.loads(data))
    pod.draining = True
    r, data = post_render(port, b"{}")
    assert r.status == 503 and r.getheader("Retry-After")
    _conforms(doc, _response_schema(doc, "/render", 503, "post"), json.loads(data))


def _example(schema: dict) -> object:
    """A value the schema allows, from the schema alone (so a field documented wrongly fails to parse)."""
    if "enum" in schema:
        return schema["enum"][-1]
    if schema.get("contentEncoding") == "base64":
        return base64.b64encode(b"\x89PNG not really").decode()
    kind = schema.get("type")
    if kind == "number":
        return min(0.5, schema.get("maximum", 0.5))
    if kind == "integer":
        return 7
    raise AssertionError(f"no example for {schema}")


def test_the_documented_bodies_are_the_ones_the_request_parser_accepts(pod_at):
    from avatar_release.serving import Limits, RenderRequest, ServeError
    from avatar_release.serving._request import FORM_FILES, decode_inputs, parse_request

    port, pod = pod_at()
    schemas = _json(port, "/openapi.json")[1]["components"]["schemas"]
    body, form = schemas["RenderRequest"], schemas["RenderForm"]
    limits = Limits(max_seconds=MAX_SECONDS)

    def parse(ctype: str, raw: bytes):
        return asyncio.run(parse_request(ctype, raw, limits))

    # JSON: the documented names are the model's fields, each accepted alone with a documented value...
    assert set(body["properties"]) == set(RenderRequest.model_fields)
    assert body["additionalProperties"] is False
    for name, schema in body["properties"].items():
        req, _, _ = parse("application/json", json.dumps({name: _example(schema)}).encode())
        assert name in req.model_fields_set, name
    # ...and a name the document does not have is refused
    with pytest.raises(ServeError) as refused:
        parse("application/json", json.dumps({"sceonds": 1}).encode())
    assert refused.value.code == "invalid_request"
    # the bound on seconds is the one decode_inputs enforces for this build
    assert body["properties"]["seconds"]["maximum"] == MAX_SECONDS
    decode_inputs(pod.build, RenderRequest(seconds=MAX_SECONDS), None, None, limits)
    with pytest.raises(ServeError, match="at most 20 s") as too_long:
        decode_inputs(pod.build, RenderRequest(seconds=MAX_SECONDS + 1 / FPS), None, None, limits)
    assert too_long.value.code == "duration_too_long"

    # multipart: files and text fields as documented are accepted together; an undocumented part is not
    files = [n for n, s in form["properties"].items() if s.get("contentMediaType") == "application/octet-stream"]
    assert files == list(FORM_FILES)
    boundary = "b0undary"

    def multipart(parts: dict[str, object], file_parts: list[str]) -> bytes:
        out = [f'--{boundary}\r\nContent-Disposition: form-data; name="{n}"\r\n\r\n{v}\r\n' for n, v in parts.items()]
        out += [
            f'--{boundary}\r\nContent-Disposition: form-data; name="{n}"; filename="{n}.bin"\r\n'
            f"Content-Type: application/octet-stream\r\n\r\nbytes of {n}\r\n"
            for n in file_parts
        ]
        return ("".join(out) + f"--{boundary}--\r\n").encode()

    ctype = f"multipart/form-data; boundary={boundary}"
    text = {n: _example(s) for n, s in form["properties"].items() if n not in files}
    req, image, audio = parse(ctype, multipart(text, files))
    assert req.model_fields_set == set(text) and (image, audio) == (b"bytes of image", b"bytes of audio")
    for extra, as_file in (("sceonds", False), ("video", True)):
        with pytest.raises(ServeError) as refused:
            parse(ctype, multipart({**text, **({} if as_file else {extra: 1})}, files + ([extra] if as_file else [])))
        assert refused.value.code == "invalid_request", extra


def test_the_streamed_video_comes_with_the_documented_headers(pod_at):
    port, pod = pod_at()
    ok = _json(port, "/openapi.json")[1]["paths"]["/render"]["post"]["responses"]["200"]
    r, data = post_render(port, json.dumps({"seconds": 0.2}).encode(), headers={"X-Request-Id": "abc-1"})
    assert r.status == 200 and data
    sent = {k.lower(): v for k, v in r.getheaders()}
    assert sent["content-type"] in ok["content"]
    ours = {k for k in sent if k.startswith("x-")} | {"cache-control"}
    assert ours == {k.lower() for k in ok["headers"]}
    assert sent["x-request-id"] == "abc-1" and sent["x-build-id"] == "fake-1" and int(sent["x-frames"]) == 5


# ------------------------------------------------------------------------------------- metrics


def test_the_new_routes_are_counted_by_route_template_and_unknown_paths_are_not(pod_at):
    port, pod = pod_at()
    for path in (
        "/v2",
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/tiny",
        "/v2/models/tiny/ready",
        "/openapi.json",
        "/v2/models/nope",
        "/v2/models/nope-2",
        "/v2/models/nope-3/ready",
        "/v2/nowhere",
        "/v2/models/a/b/c",
    ):
        _get(port, path)
    assert _get(port, "/v2/health/ready", method="POST")[0] == 405
    text = _get(port, "/metrics")[2].decode()
    counts = {
        (route, status): float(n)
        for route, status, n in re.findall(r'avatar_serve_requests_total\{route="([^"]*)",status="(\d+)"\} (\S+)', text)
    }
    assert counts == {
        ("/v2", "200"): 1,
        ("/v2/health/live", "200"): 1,
        ("/v2/health/ready", "200"): 1,
        ("/v2/health/ready", "405"): 1,
        ("/v2/models/{name}", "200"): 1,
        ("/v2/models/{name}", "404"): 2,
        ("/v2/models/{name}/ready", "200"): 1,
        ("/v2/models/{name}/ready", "404"): 1,
        ("/openapi.json", "200"): 1,
    }
    pod.draining = True  # a 503 is counted too, under the same label
    _get(port, "/v2/health/ready")
    text = _get(port, "/metrics")[2].decode()
    assert 'avatar_serve_requests_total{route="/v2/health/ready",status="503"} 1.0' in text
