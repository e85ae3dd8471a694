"""Reranking: a reranker GGUF (rank pooling) scores documents against a query, as llama.cpp computes it, through the
library and serve's llama-server routes (/rerank, /v1/rerank; Jina's, Cohere's and TEI's shapes) with Cohere's own
client."""

import json
import math

import cohere
import gguf
import httpx2 as httpx
import pytest

import localspec
from localspec.errors import InputError

from test_server import ServerProcess
from tinybert import VOCAB, write_tiny_bert
from tinyreranker import CONTROL, NO, RERANK_TEMPLATE, YES, write_tiny_qwen3

QUERY = "where is the cat"
DOCUMENTS = ["the cat sat on the mat", "a dog ran far", "cats sit", "the sun is hot"]


@pytest.fixture(scope="module")
def rerankers(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("rerankers")
    return {"qwen3": write_tiny_qwen3(folder / "qwen3-reranker.gguf"),
            "plain": write_tiny_qwen3(folder / "qwen3.gguf", reranker=False),
            "bert": write_tiny_bert(folder / "bge-reranker.gguf", pooling=gguf.PoolingType.RANK)}


def test_a_qwen3_rerankers_score_is_p_yes_over_no_after_its_own_template(rerankers):
    """llama.cpp fills the "rerank" template in, reads it, and softmaxes the head's yes/no rows: P(yes) over the two,
    which the same weights as a plain language model give from their own next-token logits."""
    reranker, plain = localspec.load(str(rerankers["qwen3"])), localspec.load(str(rerankers["plain"]))
    try:
        pairs = reranker.ranking_inputs(QUERY, DOCUMENTS)
        filled = RERANK_TEMPLATE.replace("{query}", QUERY).replace("{document}", DOCUMENTS[0])
        assert pairs[0] == reranker.target_model.tokenize(filled, False, True)
        assert pairs[0][0] == reranker.target_model.tokenize(CONTROL[0], False, True)[0]  # a control token, read as one
        scores = reranker.rerank(QUERY, DOCUMENTS)
        for pair, score in zip(pairs, scores, strict=True):
            yes, no = plain.score(pair + [YES])[-1].chosen.logprob, plain.score(pair + [NO])[-1].chosen.logprob
            assert score == pytest.approx(1 / (1 + math.exp(no - yes)), abs=1e-4)
        assert len(set(scores)) == len(scores)
    finally:
        reranker.close()
        plain.close()


def test_a_bert_rerankers_pair_is_laid_out_as_llama_servers_and_its_scores_are_raw(rerankers):
    """Without a template: [CLS] query [SEP] [SEP] document [SEP] (BOS, EOS and SEP where the vocabulary adds them,
    XLM-R's <s> q </s></s> d </s>); the score is the classifier's output itself, no sigmoid, no normalising."""
    reranker = localspec.load(str(rerankers["bert"]))
    try:
        cls, sep = VOCAB.index("[CLS]"), VOCAB.index("[SEP]")
        [pair] = reranker.ranking_inputs("ab", ["cd"])
        assert pair == [cls, VOCAB.index("\u2581a"), VOCAB.index("b"), sep, sep, VOCAB.index("\u2581c"), VOCAB.index("d"), sep]
        [cut] = reranker.ranking_inputs("ab", ["cdef"], most_document_tokens=2)
        assert cut == pair
        scores = reranker.rerank(QUERY, DOCUMENTS)
        assert len(set(scores)) == len(scores) and any(not 0 <= s <= 1 for s in scores)
        with pytest.raises(InputError, match="is a reranker"):
            reranker.embed(reranker.target_model.tokenize("the cat", True, False))
    finally:
        reranker.close()


def test_a_model_that_is_no_reranker_says_so_before_reading_anything(rerankers):
    plain = localspec.load(str(rerankers["plain"]))
    try:
        with pytest.raises(InputError, match="is not a reranker: it generates text"):
            plain.rerank(QUERY, ["x" * 5000])  # (longer than its context: the first fault is that it ranks nothing)
    finally:
        plain.close()


def test_run_and_show_on_a_reranker_say_what_it_is(localspec, rerankers):
    done = localspec("run", rerankers["qwen3"], "hi")
    assert done.returncode == 2 and b"is a reranker (qwen3)" in done.stderr and b"Traceback" not in done.stderr
    shown = localspec("show", rerankers["bert"], "--json")
    assert json.loads(shown.stdout)["capabilities"] == []
    assert b"it is a reranker" in localspec("show", rerankers["qwen3"]).stdout


def test_serve_reranks_for_cohere_jina_and_tei_clients(tmp_path, rerankers):
    server = ServerProcess(tmp_path / "home", rerankers["qwen3"], "--alias", "rerank")
    try:
        expected = localspec.load(str(rerankers["qwen3"]))
        try:
            scores = expected.rerank(QUERY, DOCUMENTS)
        finally:
            expected.close()
        best_first = sorted(range(len(DOCUMENTS)), key=lambda i: -scores[i])

        # Cohere's client, v2 and v1 (documents as objects, each result with its document)
        v2 = cohere.ClientV2(api_key="unused", base_url=server.base, max_retries=0, timeout=120)
        answer = v2.rerank(model="rerank-v3.5", query=QUERY, documents=DOCUMENTS, top_n=2)
        assert [r.index for r in answer.results] == best_first[:2]
        assert [r.relevance_score for r in answer.results] == pytest.approx([scores[i] for i in best_first[:2]], abs=1e-5)
        v1 = cohere.Client(api_key="unused", base_url=server.base, max_retries=0, timeout=120)
        answer = v1.rerank(model="rerank", query=QUERY, documents=[{"text": d} for d in DOCUMENTS], return_documents=True)
        assert [(r.index, r.document.text) for r in answer.results] == [(i, DOCUMENTS[i]) for i in best_first]

        # llama-server's own spellings: Jina's shape with usage, and TEI's (texts in, a bare list out)
        jina = httpx.post(server.base + "/rerank", json={"query": QUERY, "documents": DOCUMENTS}, timeout=120).json()
        assert jina["object"] == "list" and jina["model"] == "rerank" and jina["usage"]["prompt_tokens"] > 0
        assert [r["index"] for r in jina["results"]] == best_first
        tei = httpx.post(server.base + "/v1/reranking", json={"query": QUERY, "texts": DOCUMENTS, "return_text": True},
                         timeout=120).json()
        assert [(r["index"], r["text"]) for r in tei] == [(i, DOCUMENTS[i]) for i in best_first]
        assert [r["score"] for r in tei] == pytest.approx(sorted(scores, reverse=True), abs=1e-5)
        cut = httpx.post(server.base + "/v2/rerank", json={"query": QUERY, "documents": ["cats " * 100],
                                                           "max_tokens_per_doc": 4}, timeout=120).json()
        assert cut["usage"]["prompt_tokens"] < 60  # (the template and query ~40 tokens, the document 4 of its ~500)

        for body, said in [({"query": QUERY}, '"documents" must be a non-empty array'),
                           ({"query": QUERY, "documents": []}, '"documents" must be a non-empty array'),
                           ({"query": QUERY, "documents": [1, 2, 3]}, "documents.0"),
                           ({"query": QUERY, "documents": [{"title": "x"}]}, "documents.0: a document is a string"),
                           ({"documents": DOCUMENTS}, "query"),
                           ({"query": QUERY, "documents": DOCUMENTS, "top_n": 0}, "top_n"),
                           ({"query": QUERY, "texts": DOCUMENTS, "raw_scores": False}, "raw_scores is not supported"),
                           ({"query": QUERY, "documents": ["cats " * 4000]}, "document 1 is")]:
            refused = httpx.post(server.base + "/v1/rerank", json=body, timeout=120)
            assert refused.status_code == 400 and said in refused.json()["error"]["message"], (body, refused.text)
        with pytest.raises(cohere.BadRequestError):
            v2.rerank(model="rerank", query=QUERY, documents=[])
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_pooling_rank_makes_a_reranker_of_a_file_with_a_classifier_and_refuses_one_without(tmp_path, rerankers):
    """llama-server's --pooling rank (guides start Qwen3-Reranker so): a file with the head but no rank pooling in its
    metadata scores as the reranker it is; one without the head is refused (llama.cpp would score a number of its
    hidden state), as is a file named as a reranker that is none (community conversions that left the head out)."""
    headed = write_tiny_bert(tmp_path / "headed.gguf", classifier=True)
    with localspec.load(str(rerankers["bert"])) as reranker:
        expected = reranker.rerank(QUERY, DOCUMENTS)
    with localspec.load(str(headed)) as embedder:
        with pytest.raises(InputError, match="is not a reranker: it embeds text"):
            embedder.rerank(QUERY, DOCUMENTS)
        assert len(embedder.embed(embedder.target_model.tokenize("the cat", True, False))) > 1
    with localspec.load(str(headed), pooling="rank") as ranking:
        assert ranking.rerank(QUERY, DOCUMENTS) == pytest.approx(expected, abs=1e-5)
    with localspec.load(str(rerankers["plain"]), pooling="rank") as headless:
        with pytest.raises(InputError, match="has no classifier head"):
            headless.rerank(QUERY, DOCUMENTS)
    misnamed = write_tiny_qwen3(tmp_path / "Qwen3-Reranker-0.6B-Q8_0.gguf", reranker=False)
    with localspec.load(str(misnamed)) as broken:
        with pytest.raises(InputError, match="Its name says reranker but its file says nothing of rank pooling"):
            broken.rerank(QUERY, DOCUMENTS)


def test_serve_takes_llama_servers_pooling(localspec, tmp_path, rerankers):
    headed = write_tiny_bert(tmp_path / "headed.gguf", classifier=True)
    server = ServerProcess(tmp_path / "home", headed, "--reranking", "--pooling", "rank")
    try:
        answer = httpx.post(server.base + "/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}, timeout=120)
        assert answer.status_code == 200 and len(answer.json()["results"]) == len(DOCUMENTS), answer.text
    finally:
        assert server.stop() == 0, server.log()
    refused = localspec("serve", headed, "--pooling", "sum")
    assert refused.returncode == 2 and b"--pooling takes mean, cls, last, rank" in refused.stderr
