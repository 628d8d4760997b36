"""Opening an Iceberg table the way `--format iceberg` names it: a metadata file, a table
folder (`metadata/version-hint.text`), an SQL catalog URL with the table identifier as
fragment, or `catalog://NAME#ns.table`, a catalog configured for pyiceberg (REST, Glue, Hive,
...: `.pyiceberg.yaml` or `PYICEBERG_CATALOG__NAME__*`); with keyfill's FileIO and the
settings pyiceberg needs from the AWS environment."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode

from compactor.errors import ArchiveError

if TYPE_CHECKING:  # pyiceberg is imported where a table is opened
    from pyiceberg.table import StaticTable, Table


def io_properties() -> dict[str, str]:
    """pyiceberg FileIO properties: keyfill's FileIO (tables on GCS and Azure read through
    keyfill's storage layer), and for S3 the standard AWS settings that the AWS SDK inside
    pyarrow does not read itself (the endpoint); credentials it finds on its own chain."""
    props = {"py-io-impl": "compactor.sources.iceberg.file_io.StoreFileIO"}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        props["s3.endpoint"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        props["s3.region"] = region
    return props


def location(url: str) -> str:
    """A storage URL as pyiceberg's FileIO takes it: local paths absolute, s3a/s3n as s3."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return os.path.abspath(url)
    if scheme.lower() in ("s3a", "s3n"):
        return "s3://" + rest
    return url


def sql_catalog_table(url: str) -> Table:
    """The table `#ns.table` of the SQL catalog at `url` (`?catalog=NAME`, default "default")."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchTableError

    base, _, ident = url.partition("#")
    uri, _, raw_query = base.partition("?")  # by hand: urllib would drop the slashes of sqlite:////abs/path
    query = dict(parse_qsl(raw_query))
    name = query.pop("catalog", "default")
    if query:
        uri += "?" + urlencode(query)
    if not ident or "." not in ident:
        raise ArchiveError(f"{url}: name the table after '#' as namespace.table (e.g. {base}#redpanda.payments)")
    path = uri.split("?")[0].partition(":///")[2]
    if uri.startswith("sqlite") and not os.path.isfile(path):
        raise ArchiveError(f"{url}: no SQLite catalog file at {path!r}")
    try:
        catalog = SqlCatalog(name, uri=uri, init_catalog_tables="false", **io_properties())
        return catalog.load_table(ident)
    except NoSuchTableError:
        raise ArchiveError(
            f"{url}: catalog {name!r} has no table {ident} (choose the catalog with ?catalog=NAME)"
        ) from None
    except Exception as exc:  # SQLAlchemy errors: not a catalog database
        raise ArchiveError(f"{url}: cannot read the table from this SQL catalog: {exc}") from None


def named_catalog_table(url: str) -> Table:
    """The table `#ns.table` of the catalog pyiceberg's own configuration names NAME in
    `catalog://NAME` (its type, URI, credentials: `.pyiceberg.yaml`, PYICEBERG_CATALOG__NAME__*)."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    base, _, ident = url.partition("#")
    name = base.removeprefix("catalog://").strip("/")
    if not name or not ident or "." not in ident:
        raise ArchiveError(f"{url}: write catalog://NAME#namespace.table (NAME as configured for pyiceberg)")
    try:
        catalog = load_catalog(name, **io_properties())
    except Exception as exc:  # pyiceberg's errors for a catalog it cannot configure or reach
        raise ArchiveError(
            f"{url}: cannot open pyiceberg catalog {name!r} (configured in .pyiceberg.yaml or "
            f"PYICEBERG_CATALOG__{name.upper()}__*): {exc}"
        ) from None
    try:
        return catalog.load_table(ident)
    except NoSuchTableError:
        raise ArchiveError(f"{url}: catalog {name!r} has no table {ident}") from None
    except Exception as exc:  # a catalog server's errors (REST, Glue, Hive)
        raise ArchiveError(f"{url}: cannot read the table from catalog {name!r}: {exc}") from None


def static_table(url: str) -> StaticTable:
    from pyiceberg.table import StaticTable

    try:
        return StaticTable.from_metadata(location(url), properties=io_properties())
    except (OSError, ValueError) as exc:  # missing file, bad JSON, a metadata file pyiceberg refuses
        what = "metadata file" if url.endswith(".metadata.json") else "table folder (metadata/version-hint.text)"
        raise ArchiveError(f"{url}: cannot read the Iceberg {what}: {exc}") from None
