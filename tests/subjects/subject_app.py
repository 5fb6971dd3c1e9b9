"""The app the subject tests erase: members of tenants (composite keys), their
posts, comments (two paths: as author and under a post), likes, a pinned post
closing a loop through a nullable key, and an audit table with no foreign key.
Also the module ``trio-jobs verify`` is pointed at."""

from __future__ import annotations

import attrs

from trio_jobs import Anonymize, define_subject, subject_erase

TABLES = """
CREATE TABLE members (
    tenant_id int NOT NULL, id int NOT NULL, email text NOT NULL, name text,
    pinned_post_id int, PRIMARY KEY (tenant_id, id));
CREATE TABLE posts (
    tenant_id int NOT NULL, id int NOT NULL, author_id int NOT NULL, title text,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, author_id) REFERENCES members (tenant_id, id));
ALTER TABLE members ADD FOREIGN KEY (tenant_id, pinned_post_id) REFERENCES posts (tenant_id, id);
CREATE TABLE comments (
    id serial PRIMARY KEY, tenant_id int NOT NULL, post_id int, author_id int NOT NULL,
    body text,
    FOREIGN KEY (tenant_id, post_id) REFERENCES posts (tenant_id, id),
    FOREIGN KEY (tenant_id, author_id) REFERENCES members (tenant_id, id));
CREATE TABLE likes (
    id serial PRIMARY KEY, tenant_id int NOT NULL, post_id int NOT NULL, note text,
    FOREIGN KEY (tenant_id, post_id) REFERENCES posts (tenant_id, id));
CREATE TABLE invoices (
    id serial PRIMARY KEY, tenant_id int NOT NULL, member_id int, total int NOT NULL,
    FOREIGN KEY (tenant_id, member_id) REFERENCES members (tenant_id, id));
CREATE TABLE audit_copies (id serial PRIMARY KEY, tenant_id int, member_id int, who text);
"""


@attrs.frozen
class Person:
    tenant_id: int
    member_id: int


members = define_subject(
    "members",
    key=("tenant_id", "id"),
    tables={
        "members": "delete",
        "posts": "delete",
        "comments": "delete",
        "likes": "delete",
        "invoices": Anonymize({"member_id": None}),
        "audit_copies": Anonymize({"who": "erased"}),
    },
    columns={"audit_copies": ("tenant_id", "member_id")},
)

erase_member = subject_erase(
    name="members.erase",
    input=Person,
    tenant=lambda p: str(p.tenant_id),
    subject=members,
    key=lambda p: (p.tenant_id, p.member_id),
)
