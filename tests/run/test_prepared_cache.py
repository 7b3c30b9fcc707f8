"""The on-disk prepared cache (graphveil.run.prepared_cache) and its use by a federated site.

A hit must give exactly the states the encoder would compute; any change of data, model
weights or encoder option must miss; a damaged or foreign file is refused and rebuilt; the
site's ledger accounting is the same with or without the cache, and a spent budget is refused
with a warm cache as without one.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest
import torch

from graphveil.data import RelationalGraph
from graphveil.plugins import hf_common
from graphveil.plugins.hf_lora.encoder import HfLoraEncoder, HfLoraParams
from graphveil.run.prepared_cache import MAGIC, PreparedCache

#: A site key for the file-store tests (a site's own comes from graphveil.ledger.site_key).
SITE_KEY = bytes(range(32))
TEXTS = ["graph neural networks for citation data", "privacy of relational learning",
         "a survey of text encoders", "differential privacy with sampling"]


def _graph(texts: list[str] = TEXTS) -> RelationalGraph:
    return RelationalGraph(name="g", entity_ids=[f"e{i}" for i in range(len(texts))],
                           edges=torch.tensor([[0, 1], [1, 2], [2, 3]]), texts=list(texts))


def _prepared(cache: PreparedCache | None, graph: RelationalGraph | None = None, **kw) -> HfLoraEncoder:
    """A fresh tiny encoder (one frozen layer) prepared on ``graph``, as in a new process."""
    hf_common._FROZEN_CACHE.clear()  # a new process has no in-memory states
    params = {"model": "tiny-bert", "max_length": 12, "lora_layers": 1, "seed": 0, **kw}
    enc = HfLoraEncoder(HfLoraParams(**params))
    enc.prepared_cache = cache
    enc.prepare(graph or _graph())
    return enc


# ------------------------------------------------------------------------------ the file store


def test_store_roundtrip_atomic_private_files(tmp_path: Path) -> None:
    store = PreparedCache(tmp_path / "c", key=SITE_KEY)
    assert store.load("k") is None and store.misses == 1
    path = store.save("k", {"a": torch.arange(6.0).reshape(2, 3)})
    assert torch.equal(store.load("k")["a"], torch.arange(6.0).reshape(2, 3)) and store.hits == 1
    assert path.stat().st_mode & 0o777 == 0o600 and (tmp_path / "c").stat().st_mode & 0o777 == 0o700
    assert [p.name for p in (tmp_path / "c").iterdir()] == [path.name]  # no temporary file left


@pytest.mark.parametrize("damage", ["truncate", "flip", "foreign", "empty", "checked"])
def test_damaged_or_foreign_file_is_refused_and_removed(tmp_path: Path, damage: str) -> None:
    store = PreparedCache(tmp_path, key=SITE_KEY)
    path = store.save("k", {"a": torch.ones(100)})
    raw = path.read_bytes()
    check = None
    if damage == "truncate":  # a copy interrupted half-way
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":  # one byte of the tensor's data changed (torch itself would read it)
        at = raw.find(torch.ones(100).numpy().tobytes()) + 7
        assert at > 7
        path.write_bytes(raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1:])
    elif damage == "foreign":  # a valid file of another key, put under this key's name
        path.write_bytes(store.save("other", {"a": torch.zeros(100)}).read_bytes())
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # intact, but the caller's check refuses its tensors
        def check(tensors):
            raise ValueError("wrong shape")
    assert store.load("k", check) is None
    assert not path.exists()  # the next save replaces it


def test_store_keeps_at_most_keep_files_least_recently_used_first(tmp_path: Path) -> None:
    store = PreparedCache(tmp_path, key=SITE_KEY, keep=2)
    for i, key in enumerate(("a", "b")):
        store.save(key, {"x": torch.zeros(1)})
        os.utime(store.path(key), (1000 + i, 1000 + i))
    store.load("a")  # used: now the newest
    store.save("c", {"x": torch.zeros(1)})
    assert store.path("a").exists() and store.path("c").exists() and not store.path("b").exists()
    with pytest.raises(ValueError):
        PreparedCache(tmp_path, key=SITE_KEY, keep=0)


# ------------------------------------------------------------------------------ the encoder's frozen states


def test_hit_gives_exactly_the_computed_states(tmp_path: Path) -> None:
    store = PreparedCache(tmp_path, key=SITE_KEY)
    first = _prepared(store)
    assert (store.hits, store.misses) == (0, 1) and len(list(tmp_path.iterdir())) == 1
    second = _prepared(store)
    assert (store.hits, store.misses) == (1, 1)
    plain = _prepared(None)
    for enc in (first, second):
        assert torch.equal(enc._hidden, plain._hidden) and torch.equal(enc._mask, plain._mask)
    ids = torch.tensor([0, 2, 3])
    assert torch.equal(second.embed(ids), plain.embed(ids))


@pytest.mark.parametrize("change", ["text", "weights", "max_length", "layers"])
def test_changed_data_model_or_option_misses(tmp_path: Path, change: str) -> None:
    store = PreparedCache(tmp_path, key=SITE_KEY)
    _prepared(store)
    graph, kw = _graph(), {}
    if change == "text":  # same token count: only the token ids differ
        texts = list(TEXTS)
        texts[1] = texts[1].replace("privacy", "utility")
        graph = _graph(texts)
    elif change == "weights":  # tiny-bert's random weights come from the seed
        kw = {"seed": 1}
    elif change == "max_length":
        kw = {"max_length": 10}
    else:
        kw = {"lora_layers": 2}  # no frozen layer: the states are the embeddings
    changed = _prepared(store, graph, **kw)
    assert (store.hits, store.misses) == (0, 2)
    plain = _prepared(None, graph, **kw)
    assert torch.equal(changed._hidden, plain._hidden)


def test_hit_tokenizes_nothing_and_a_changed_tokenizer_misses(tmp_path: Path, monkeypatch) -> None:
    """The key holds the texts and the tokenizer's fingerprint, not its output: a hit skips
    tokenizing; a tokenizer that would cut or pad differently, or another vocabulary, misses."""
    store = PreparedCache(tmp_path, key=SITE_KEY)
    plain = _prepared(store)

    def no_tokens(self, texts):
        raise AssertionError("tokenized on a hit")

    with monkeypatch.context() as m:
        m.setattr(HfLoraEncoder, "_tokenize", no_tokens)
        hit = _prepared(store)
    assert (store.hits, store.misses) == (1, 1)
    assert torch.equal(hit._hidden, plain._hidden) and torch.equal(hit._mask, plain._mask)
    enc = HfLoraEncoder(HfLoraParams(model="tiny-bert", max_length=12, lora_layers=1, seed=0))
    keys = {enc.prepared_key(TEXTS)}
    enc.tokenizer.truncation_side = "left"
    keys.add(enc.prepared_key(TEXTS))
    enc.tokenizer.truncation_side = "right"
    enc.tokenizer.add_tokens(["graphveil"])
    keys.add(enc.prepared_key(TEXTS))
    assert len(keys) == 3
    assert hf_common.texts_digest(["a\x00", "b"]) != hf_common.texts_digest(["a", "\x00b"])


def test_slow_tokenizer_keys_on_its_tokens(tmp_path: Path, monkeypatch) -> None:
    """Without a fast tokenizer's pipeline to fingerprint, the key holds the tokens."""
    enc = HfLoraEncoder(HfLoraParams(model="tiny-bert", max_length=12, lora_layers=1, seed=0))
    monkeypatch.setattr(hf_common, "tokenizer_fingerprint", lambda tokenizer: None)
    inputs, mask = enc._tokenize(TEXTS)
    changed = {k: v.clone() for k, v in inputs.items()}
    changed["input_ids"][0, 1] += 1
    assert enc.prepared_key(TEXTS, lambda: (inputs, mask)) == enc.prepared_key(TEXTS)
    assert enc.prepared_key(TEXTS, lambda: (changed, mask)) != enc.prepared_key(TEXTS)


def test_frozen_head_keeps_its_text_embeddings_between_processes(tmp_path: Path, monkeypatch) -> None:
    """frozen_head on a text model: a later process loads the embeddings (no tokenizing, no
    forward pass) and they equal the computed ones; other texts miss; a bad file is rebuilt."""
    from graphveil.plugins.hf_lora import frozen_head
    from graphveil.plugins.hf_lora.frozen_head import FrozenHeadEncoder, FrozenHeadParams

    def prepared(store: PreparedCache | None, texts: list[str] = TEXTS) -> FrozenHeadEncoder:
        frozen_head._EMBEDDING_CACHE.clear()  # a new process
        enc = FrozenHeadEncoder(FrozenHeadParams(model="tiny-bert", max_length=12, head="diagonal"))
        enc.prepared_cache = store
        enc.prepare(_graph(texts))
        return enc

    store = PreparedCache(tmp_path, key=SITE_KEY)
    plain = prepared(None).base_embeddings()
    assert torch.equal(prepared(store).base_embeddings(), plain) and (store.hits, store.misses) == (0, 1)
    with monkeypatch.context() as m:
        m.setattr(FrozenHeadEncoder, "_embed_texts", lambda self, texts: pytest.fail("embedded on a hit"))
        m.setattr(FrozenHeadEncoder, "_tokens", lambda self, texts: pytest.fail("tokenized on a hit"))
        assert torch.equal(prepared(store).base_embeddings(), plain) and store.hits == 1
    other = [t + " again" for t in TEXTS]
    assert torch.equal(prepared(store, other).base_embeddings(), prepared(None, other).base_embeddings())
    assert store.misses == 2
    enc = prepared(store)
    store.save(enc.prepared_key(TEXTS), {"embeddings": torch.full((len(TEXTS), enc.dim), float("nan"))})
    assert torch.equal(prepared(store).base_embeddings(), plain) and store.misses == 3


def test_tampered_states_with_valid_checksum_are_refused_and_rebuilt(tmp_path: Path) -> None:
    store = PreparedCache(tmp_path, key=SITE_KEY)
    enc = _prepared(store)
    key = enc.prepared_key(TEXTS)
    for bad in (enc._hidden[:2], enc._hidden.clone().fill_(float("nan")), enc._hidden.double()):
        store.save(key, {"hidden": bad, "mask": enc._mask})
        rebuilt = _prepared(store)
        assert torch.equal(rebuilt._hidden, enc._hidden)
        assert torch.equal(store.load(key)["hidden"], enc._hidden)  # the rebuilt file replaced it


@pytest.mark.parametrize("forger", ["plain-sha256", "another-key", "version-1"])
def test_a_file_rewritten_in_place_without_the_site_key_changes_nothing(tmp_path: Path, forger: str) -> None:
    """Someone who can write the cache folder but lacks the site key rewrites the tensors of a
    valid file (same key, shapes, dtypes, finite: the encoder's own checks pass) and recomputes
    the header: the file is refused before it is unpickled, the states are recomputed, and the
    file is replaced by the site's own."""
    store = PreparedCache(tmp_path, key=SITE_KEY)
    enc = _prepared(store)
    key = enc.prepared_key(TEXTS)
    (path,) = tmp_path.iterdir()
    planted = {"hidden": enc._hidden + 1.0, "mask": enc._mask}
    buffer = io.BytesIO()
    torch.save({"key": key, "tensors": planted}, buffer)
    payload = buffer.getvalue()
    if forger == "plain-sha256":  # the checksum as it was: no key, so anyone can recompute it
        path.write_bytes(MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    elif forger == "another-key":
        PreparedCache(tmp_path, key=bytes(32)).save(key, planted)
    else:  # a file of the unkeyed format
        path.write_bytes(b"graphveil-prepared-v1\n" + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    assert path.read_bytes().endswith(payload)  # the planted tensors are in the file
    rebuilt = _prepared(store)
    assert (store.hits, store.misses) == (0, 2)
    plain = _prepared(None)
    assert torch.equal(rebuilt._hidden, plain._hidden) and torch.equal(rebuilt._mask, plain._mask)
    ids = torch.tensor([0, 1, 3])
    assert torch.equal(rebuilt.embed(ids), plain.embed(ids))
    assert torch.equal(store.load(key)["hidden"], plain._hidden)  # the site's own file replaced it


def test_a_site_cache_is_keyed_with_the_site_key_or_off(tmp_path: Path, caplog) -> None:
    from graphveil.ledger.site_key import create_site_key, key_path_for

    ledger = tmp_path / "ledger.sqlite"
    with caplog.at_level("WARNING", logger="graphveil.run.prepared_cache"):
        assert PreparedCache.for_site(tmp_path / "cache", ledger) is None
    assert "prepared cache off: " in caplog.text and "no site key" in caplog.text
    key = create_site_key(key_path_for(ledger))
    store = PreparedCache.for_site(tmp_path / "cache", ledger)
    store.save("k", {"a": torch.ones(3)})
    assert torch.equal(PreparedCache(tmp_path / "cache", key=key).load("k")["a"], torch.ones(3))
    assert PreparedCache(tmp_path / "cache", key=bytes(32)).load("k") is None  # another site's key
    key_path_for(ledger).chmod(0o644)
    caplog.clear()
    with caplog.at_level("WARNING", logger="graphveil.run.prepared_cache"):
        assert PreparedCache.for_site(tmp_path / "cache", ledger) is None
    assert "readable by others" in caplog.text
    with pytest.raises(ValueError, match="at least 32 bytes"):
        PreparedCache(tmp_path, key=b"short")


def test_cache_file_holds_only_the_frozen_states(tmp_path: Path) -> None:
    """Nothing from training (adapter, noise, sampling) enters the cache: the file is the
    frozen states and mask only, and training does not change it."""
    store = PreparedCache(tmp_path, key=SITE_KEY)
    enc = _prepared(store)
    (path,) = tmp_path.iterdir()
    before = path.read_bytes()
    assert before.startswith(MAGIC)
    with torch.no_grad():
        for p in enc.trainable_parameters():
            p.add_(1.0)  # a trained adapter
    _prepared(store)
    assert path.read_bytes() == before
    assert set(store.load(enc.prepared_key(TEXTS))) == {"hidden", "mask"}


def test_unwritable_cache_folder_does_not_fail_the_preparation(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    enc = _prepared(PreparedCache(blocker / "cache", key=SITE_KEY))
    assert torch.equal(enc._hidden, _prepared(None)._hidden)


# ------------------------------------------------------------------------------ a federated site


def _site_rounds(tmp_path: Path, node: dict, rounds: range, caplog) -> list:
    """``handle_train`` for these rounds with real sessions (tiny-bert, 2 local steps)."""
    from _fed_support import init_site_ledger, site_context

    from graphveil.connectors.flower import records
    from graphveil.connectors.flower.settings import FederationSettings
    from graphveil.connectors.flower.site import handle_train
    from graphveil.contract.host import default_host
    from graphveil.contract.model import Encoder  # noqa: F401 - the encoder plugins register on import

    run = {"num-server-rounds": 3, "local-steps": 2, "min-sites": 1,
           "task.sampler.name": "edge_poisson_decoupled", "task.sampler.batch_size": 8, "task.sampler.k_neg": 2,
           "task.clipper.name": "per_tuple_clip", "task.accountant.name": "edge_rdp",
           "task.encoder.name": "hf_lora", "task.encoder.model": "tiny-bert", "task.encoder.max_length": 12,
           "task.encoder.lora_layers": 1, "task.privacy.noise_multiplier": 2.0}
    task = FederationSettings.from_run_config(run).check_task()
    state = default_host().create("encoder", task.encoder.name, task.encoder.params, where="test").trainable_state()
    if not Path(node["ledger"]).exists():  # the operator's `graphveil budget init`, once
        init_site_ledger(node)
    ctx = site_context(3, node, run)
    from graphveil.ledger.site_key import create_site_key, key_path_for

    if not key_path_for(node["ledger"]).exists():  # `graphveil budget init` creates it at a site
        create_site_key(key_path_for(node["ledger"]))
    replies = []
    for server_round in rounds:
        hf_common._FROZEN_CACHE.clear()  # each round runs in a new process at a real site
        caplog.clear()
        reply = handle_train(records.train_content(records.arrays_from_state(state), server_round, 2), ctx)
        replies.append((reply.config_records[records.SITE]["status"], caplog.text))
    return replies


@pytest.fixture
def site_files(tmp_path: Path) -> tuple[str, str]:
    from graphveil.connectors.flower.partition import write_partition
    from graphveil.data import load_bundled_citeseer

    edges, entities = write_partition(load_bundled_citeseer(), 8, tmp_path / "data", seed=0)[0]
    return str(edges), str(entities)


@pytest.mark.slow
@pytest.mark.usefixtures("flower_task")
def test_site_rounds_reuse_the_cache_and_account_exactly_as_without_it(tmp_path: Path, site_files, caplog
                                                                        ) -> None:
    import logging

    from graphveil.ledger import PrivacyLedger

    caplog.set_level(logging.INFO, logger="graphveil")
    edges, entities = site_files
    base = {"site-name": "bank-a", "data-path": edges, "data-entities": entities, "epsilon-budget": 1000.0,
            "delta": 1e-6, "privacy-unit": "edge", "min-records": 64}
    cached = {**base, "ledger": str(tmp_path / "a" / "ledger.sqlite")}
    off = {**base, "ledger": str(tmp_path / "b" / "ledger.sqlite"), "prepared-cache": "off"}
    with_cache = _site_rounds(tmp_path, cached, range(1, 3), caplog)
    without = _site_rounds(tmp_path, off, range(1, 3), caplog)
    assert [s for s, _ in with_cache + without] == ["trained"] * 4
    assert "0 hit(s), 1 miss(es)" in with_cache[0][1] and "1 hit(s), 0 miss(es)" in with_cache[1][1]
    assert "prepared cache off" in without[1][1]
    folder = tmp_path / "a" / "ledger.sqlite.prepared"  # the default: next to the ledger
    assert len(list(folder.iterdir())) == 1 and not (tmp_path / "b" / "ledger.sqlite.prepared").exists()
    ledgers = []
    for sub in ("a", "b"):
        with PrivacyLedger(tmp_path / sub / "ledger.sqlite") as ledger:
            ledgers.append([(e.status, e.round, e.steps, e.epsilon) for e in ledger.entries()])
    assert ledgers[0] == ledgers[1] and len(ledgers[0]) == 2 and all(e[0] == "released" for e in ledgers[0])


@pytest.mark.slow
@pytest.mark.usefixtures("flower_task")
def test_a_warm_cache_never_skips_the_budget_check(tmp_path: Path, site_files, caplog) -> None:
    """A round with a warm cache is refused when the ledger shows the budget spent, as without one;
    restoring an old copy of the cache folder changes nothing in the accounting."""
    import shutil

    from graphveil.ledger import PrivacyLedger

    edges, entities = site_files
    node = {"site-name": "bank-a", "data-path": edges, "data-entities": entities, "epsilon-budget": 1000.0,
            "delta": 1e-6, "privacy-unit": "edge", "min-records": 64, "ledger": str(tmp_path / "ledger.sqlite"),
            "prepared-cache": str(tmp_path / "cache")}
    assert _site_rounds(tmp_path, node, range(1, 2), caplog)[0][0] == "trained"
    shutil.copytree(tmp_path / "cache", tmp_path / "cache-backup")
    with PrivacyLedger(tmp_path / "ledger.sqlite") as ledger:
        spent = ledger.spent_epsilon()
    lowered = {**node, "epsilon-budget": spent}  # the operator lowers the budget to what is spent
    assert _site_rounds(tmp_path, lowered, range(2, 3), caplog)[0][0] == "refused"
    shutil.rmtree(tmp_path / "cache")
    shutil.copytree(tmp_path / "cache-backup", tmp_path / "cache")  # an old copy restored
    assert _site_rounds(tmp_path, lowered, range(2, 3), caplog)[0][0] == "refused"
    with PrivacyLedger(tmp_path / "ledger.sqlite") as ledger:
        assert ledger.spent_epsilon() == spent and ledger.total_steps() == 2


def test_node_config_key_prepared_cache() -> None:
    from graphveil.connectors.flower.settings import SiteSettings
    from graphveil.contract.errors import ConfigError

    base = {"site-name": "a", "ledger": "/state/l.sqlite", "epsilon-budget": 1.0, "delta": 1e-6,
            "privacy-unit": "edge", "min-records": 64, "data-source": "citeseer"}
    assert SiteSettings.from_mapping(base).prepared_cache_dir == Path("/state/l.sqlite.prepared")
    assert SiteSettings.from_mapping({**base, "prepared-cache": "off"}).prepared_cache_dir is None
    assert SiteSettings.from_mapping({**base, "prepared-cache": "/c"}).prepared_cache_dir == Path("/c")
    with pytest.raises(ConfigError, match="prepared-cache: .*absolute path or 'off'"):
        SiteSettings.from_mapping({**base, "prepared-cache": "cache"})
