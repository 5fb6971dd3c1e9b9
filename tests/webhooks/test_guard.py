"""The SSRF guard (PYTHON-API.md: "a URL whose host is or resolves to a
loopback, private, link-local, multicast, unspecified or cloud-metadata address
(any spelling: decimal, hex, IPv4-mapped IPv6) is refused terminally with
X_WEBHOOK_ENDPOINT_INVALID, before any connection; redirects are not followed").

Hypothesis spells refused addresses every way ``inet_aton`` reads them; glibc's
own ``inet_aton`` is the oracle for the parser. The resolve-time half is driven
through Trio's custom hostname resolver: a name that resolves to a refused
address is refused at connect time, and the connection goes to the address
that was checked, with the URL's Host header."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_jobs import ErrorCode, JobsError, Retry, WebhookDelivery
from trio_jobs import _webhook_guard as guard
from trio_jobs._webhook_guard import (
    EndpointRefused,
    address_fault,
    check_url,
    client_for,
    literal_address,
    resolve_checked,
)

from .receiver import open_receiver
from .support import App, make, running, settle

REFUSED_NETWORKS = [
    "127.0.0.0/8",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",
    "100.64.0.0/10",
    "224.0.0.0/4",
    "0.0.0.0/8",
    "240.0.0.0/4",
]


def _spell(value: int, parts: int, bases: list[str]) -> str:
    """``value`` as ``inet_aton`` reads it in ``parts`` parts (the last fills the rest)."""
    head = [(value >> (8 * (3 - i))) & 0xFF for i in range(parts - 1)]
    last = value & ((1 << (8 * (4 - (parts - 1)))) - 1)
    out = []
    for n, base in zip([*head, last], bases, strict=False):
        if base == "hex":
            out.append(hex(n))
        elif base == "HEX":
            out.append("0X" + format(n, "X"))
        elif base == "oct":
            out.append("0" + format(n, "o"))
        else:
            out.append(str(n))
    return ".".join(out)


@st.composite
def refused_spellings(draw: Any) -> tuple[str, ipaddress.IPv4Address]:
    network = ipaddress.ip_network(draw(st.sampled_from(REFUSED_NETWORKS)))
    offset = draw(st.integers(0, network.num_addresses - 1))
    ip = network[offset]
    parts = draw(st.integers(1, 4))
    bases = draw(st.lists(st.sampled_from(["dec", "hex", "HEX", "oct"]), min_size=4, max_size=4))
    return _spell(int(ip), parts, bases), ip


@settings(max_examples=400, deadline=None)
@given(refused_spellings())
def test_every_spelling_of_a_refused_ipv4_address_is_refused(case: Any) -> None:
    spelling, ip = case
    assert literal_address(spelling) == ip
    assert socket.inet_aton(spelling) == ip.packed  # glibc reads it the same
    assert address_fault(ip) is not None
    with pytest.raises(JobsError) as refused:
        check_url("e1", f"https://{spelling}/hook", allow_private=False)
    assert refused.value.code == ErrorCode.X_WEBHOOK_ENDPOINT_INVALID
    # The IPv4-mapped IPv6 spelling of it, too.
    with pytest.raises(JobsError):
        check_url("e1", f"https://[::ffff:{ip}]/hook", allow_private=False)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789abcdefxX.", min_size=1, max_size=20))
def test_the_literal_parser_agrees_with_inet_aton(text: str) -> None:
    try:
        packed: bytes | None = socket.inet_aton(text)
    except OSError:
        packed = None
    ours = literal_address(text.rstrip(".") if text.endswith(".") and text != "." else text)
    if packed is not None and not text.endswith("."):
        assert ours == ipaddress.IPv4Address(packed)
    elif packed is None and ours is not None:
        # Ours may read a trailing-dot name as its address; glibc refuses it but a
        # resolver accepts "127.0.0.1." as that address: refusing it is the safe side.
        assert text.endswith(".")


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "127.1",
        "0x7f.1",
        "0x7f000001",
        "2130706433",
        "017700000001",
        "0177.0.0.1",
        "127.0.0.1.",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "169.254.169.254",
        "0xa9fea9fe",
        "2852039166",
        "0",
        "0.0.0.0",
        "224.0.0.1",
        "255.255.255.255",
        "[::1]",
        "[0:0:0:0:0:0:0:1]",
        "[::]",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "[::ffff:169.254.169.254]",
        "[::127.0.0.1]",
        "[64:ff9b::7f00:1]",
        "[64:ff9b::a9fe:a9fe]",
        "[2002:7f00:1::]",
        "[fe80::1]",
        "[fe80::1%25eth0]",
        "[fc00::1]",
        "[fd00:ec2::254]",
        "[ff02::1]",
        "localhost",
        "LOCALHOST.",
        "metadata.google.internal",
        "metadata",
        "instance-data",
    ],
)
def test_refused_hosts(host: str) -> None:
    with pytest.raises(JobsError) as refused:
        check_url("e1", f"https://{host}/hook?token=SECRET-PATH", allow_private=False)
    assert refused.value.code == ErrorCode.X_WEBHOOK_ENDPOINT_INVALID
    assert "SECRET-PATH" not in str(refused.value)
    assert "nothing was sent" in refused.value.message


@pytest.mark.parametrize(
    "host", ["93.184.216.34", "8.8.8.8", "[2606:4700:4700::1111]", "partner.example.com"]
)
def test_public_hosts_pass_the_literal_check(host: str) -> None:
    assert check_url("e1", f"https://{host}/hook", allow_private=False).host


@pytest.mark.parametrize(
    "url",
    [
        "http://partner.example.com/hook",  # http only with allow_private
        "ftp://partner.example.com/hook",
        "https:///hook",
        "https://user:pass@partner.example.com/hook",
        "https://partner.example.com/a b",
        "not a url",
        "",
        "https://" + "a" * 3000 + ".com/",
    ],
)
def test_malformed_urls_are_refused(url: str) -> None:
    with pytest.raises(JobsError) as refused:
        check_url("e1", url, allow_private=False)
    assert refused.value.code == ErrorCode.X_WEBHOOK_ENDPOINT_INVALID


def test_allow_private_admits_loopback_and_http() -> None:
    assert check_url("e1", "http://127.0.0.1:8080/hook", allow_private=True).port == 8080


def test_a_checked_url_is_remembered_per_mode_and_a_refused_one_never() -> None:
    """check_url parses an endpoint's URL once (a pure check: no name is resolved
    there): the same URL answers the same parse; one that passed with
    allow_private=True is still refused without it, every time."""
    url = "http://127.0.0.1:8080/hook-remembered"
    first = check_url("e1", url, allow_private=True)
    assert check_url("e2", url, allow_private=True) is first
    for _ in range(2):
        with pytest.raises(JobsError) as refused:
            check_url("e1", url, allow_private=False)
        assert refused.value.code == ErrorCode.X_WEBHOOK_ENDPOINT_INVALID
    assert (url, False) not in guard._CHECKED


async def test_by_default_a_loopback_endpoint_is_refused_and_sent_nothing() -> None:
    """The guard is on unless allow_private=True: the real server on 127.0.0.1
    hears nothing, under any spelling (``https``: the only scheme it admits)."""
    app = App()
    async with open_receiver() as rx:
        for i, host in enumerate(["127.0.0.1", "127.1", "2130706433", "[::ffff:127.0.0.1]"]):
            app.add(f"e{i}", f"https://{host}:{rx.port}/ok")
        app.publish("ev1")
        deliver = make(app, allow_private=False)
        async with running(deliver) as jobs:
            views = [
                await settle(jobs, (await deliver.enqueue(WebhookDelivery(f"e{i}", "ev1"))).id)
                for i in range(4)
            ]
        assert rx.requests == []
        assert rx.connections == 0
    assert {v.error_code for v in views} == {ErrorCode.X_WEBHOOK_ENDPOINT_INVALID}
    assert {v.attempts for v in views} == {1}


class Resolver(trio.abc.HostnameResolver):
    """A resolver that answers from a table (one list of addresses per call)."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    async def getaddrinfo(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        self.calls.append(name)
        queue = self.answers.get(name)
        if not queue:
            raise socket.gaierror(socket.EAI_NONAME, "unknown")
        addresses = queue.pop(0) if len(queue) > 1 else queue[0]
        out = []
        for a in addresses:
            family = socket.AF_INET6 if ":" in a else socket.AF_INET
            sockaddr = (a, int(port or 0), 0, 0) if ":" in a else (a, int(port or 0))
            out.append((family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr))
        return out

    async def getnameinfo(self, *args: Any) -> Any:  # pragma: no cover
        raise NotImplementedError


@pytest.mark.parametrize(
    "answers",
    [
        ["127.0.0.1"],
        ["10.0.0.7"],
        ["93.184.216.34", "169.254.169.254"],
        ["::1"],
        ["::ffff:10.0.0.1"],
    ],
)
async def test_a_name_resolving_to_a_refused_address_is_refused_at_connect(
    answers: list[str],
) -> None:
    trio.socket.set_custom_hostname_resolver(Resolver({"partner.example": [answers]}))
    try:
        with pytest.raises(EndpointRefused):
            await resolve_checked("partner.example", 443)
    finally:
        trio.socket.set_custom_hostname_resolver(None)


async def test_a_refused_name_through_webhook_is_endpoint_invalid_and_sends_nothing() -> None:
    app = App()
    async with open_receiver() as rx:
        # Passes the literal check (a name), resolves to the receiver's loopback.
        resolver = Resolver({"rebind.example": [["127.0.0.1"]]})
        app.add("e1", f"https://rebind.example:{rx.port}/ok")
        app.publish("ev1")
        deliver = make(app, allow_private=False, retry=Retry(attempts=1))
        trio.socket.set_custom_hostname_resolver(resolver)
        try:
            async with running(deliver) as jobs:
                view = await settle(jobs, (await deliver.enqueue(WebhookDelivery("e1", "ev1"))).id)
        finally:
            trio.socket.set_custom_hostname_resolver(None)
        assert rx.connections == 0
    assert view.error_code == ErrorCode.X_WEBHOOK_ENDPOINT_INVALID
    assert "loopback" in (view.last_error or "")
    assert resolver.calls == ["rebind.example"]
    [attempt] = await deliver.ledger.attempts()
    assert attempt.status is None


async def test_the_connection_goes_to_the_checked_address_with_the_urls_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Resolved once per connection: a resolver that would answer a private
    address the second time is never asked again; the request reaches the
    address that was checked and carries the URL's Host header. (Loopback
    stands in for a public address here: the fault check is told to pass it.)"""
    real_fault = guard.address_fault
    monkeypatch.setattr(
        guard, "address_fault", lambda ip: None if ip.is_loopback else real_fault(ip)
    )
    async with open_receiver() as rx:
        resolver = Resolver({"partner.example": [["127.0.0.1"], ["10.0.0.9"]]})
        trio.socket.set_custom_hostname_resolver(resolver)
        try:
            client = client_for(guard=True)
            for _ in range(3):
                answer = await client.post(f"http://partner.example:{rx.port}/ok", content=b"{}")
                assert answer.status_code == 200
            # A second name that resolves to a private address is refused.
            resolver.answers["other.example"] = [["10.0.0.9"]]
            with pytest.raises(EndpointRefused):
                await client.post(f"http://other.example:{rx.port}/ok", content=b"{}")
        finally:
            trio.socket.set_custom_hostname_resolver(None)
        assert [r.headers["host"] for r in rx.requests] == [f"partner.example:{rx.port}"] * 3
        assert rx.connections == 1  # kept alive: one connection, resolved once
    assert resolver.calls == ["partner.example", "other.example"]


async def test_a_delivery_post_goes_through_the_guarded_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """guard.post (what a delivery sends with) rides the client's own pool: the
    name is resolved once per connection and checked, the connection is kept
    alive, the URL's Host and the body's length are sent; a refused name is
    EndpointRefused before any connection."""
    real_fault = guard.address_fault
    monkeypatch.setattr(
        guard, "address_fault", lambda ip: None if ip.is_loopback else real_fault(ip)
    )
    async with open_receiver() as rx:
        resolver = Resolver({"partner.example": [["127.0.0.1"], ["10.0.0.9"]]})
        trio.socket.set_custom_hostname_resolver(resolver)
        try:
            url = check_url("e1", f"http://partner.example:{rx.port}/ok", allow_private=True)
            for i in range(3):
                status, _headers = await guard.post(
                    url, [(b"x-n", str(i).encode())], b'{"n":1}', guard=True, cap=1024
                )
                assert status == 200
            resolver.answers["other.example"] = [["10.0.0.9"]]
            other = check_url("e1", f"http://other.example:{rx.port}/ok", allow_private=True)
            with pytest.raises(EndpointRefused):
                await guard.post(other, [], b"{}", guard=True, cap=1024)
        finally:
            trio.socket.set_custom_hostname_resolver(None)
        assert [r.headers["host"] for r in rx.requests] == [f"partner.example:{rx.port}"] * 3
        assert [r.headers["content-length"] for r in rx.requests] == ["7"] * 3
        assert [r.headers["x-n"] for r in rx.requests] == ["0", "1", "2"]
        assert rx.connections == 1
    assert resolver.calls == ["partner.example", "other.example"]


async def test_one_client_per_trio_run_and_guard_mode() -> None:
    assert client_for(guard=True) is client_for(guard=True)
    assert client_for(guard=False) is not client_for(guard=True)
    assert client_for(guard=True).follow_redirects is False
    assert client_for(guard=True).trust_env is False
