from localspec.engine.text import TextStream


def feed(stream, pieces):
    return [stream.push(p) for p in pieces]


def test_text_passes_through_without_stop_strings():
    stream = TextStream()
    assert feed(stream, [b"Hello", b", ", b"world"]) == ["Hello", ", ", "world"]
    assert stream.flush() == "" and stream.text == "Hello, world"


def test_multibyte_characters_split_across_tokens_come_out_whole():
    stream = TextStream()
    euro = "€".encode()
    assert feed(stream, [b"5 ", euro[:1], euro[1:2], euro[2:]]) == ["5 ", "", "", "€"]


def test_stop_string_spanning_tokens_is_held_back_and_cut():
    stream = TextStream(stop=("\n\nUser:",))
    out = feed(stream, [b"Answer.", b"\n", b"\nUs", b"er:", b" more"])
    assert out == ["Answer.", "", "", "", ""]
    assert stream.stopped and stream.text == "Answer."


def test_held_back_text_is_released_when_it_stops_looking_like_a_stop():
    stream = TextStream(stop=("END",))
    assert feed(stream, [b"the E", b"Nx"]) == ["the ", "ENx"]
    assert not stream.stopped


def test_nothing_is_released_after_a_stop():
    stream = TextStream(stop=("END",))
    assert feed(stream, [b"the E", b"N", b"D-less", b"x"]) == ["the ", "", "", ""]
    assert stream.stopped and stream.text == "the " and stream.flush() == ""


def test_flush_releases_a_dangling_stop_prefix():
    stream = TextStream(stop=("###",))
    assert feed(stream, [b"done #"]) == ["done "]
    assert stream.flush() == "#"
    assert stream.text == "done #"


def test_earliest_of_several_stop_strings_wins():
    stream = TextStream(stop=("b", "a"))
    stream.push(b"xxabyy")
    assert stream.text == "xx"


def test_a_character_cut_short_by_the_end_is_dropped_not_replaced():
    stream = TextStream()
    assert stream.push("a €".encode()[:-1]) == "a "  # the euro sign's last byte never came
    assert stream.flush() == "" and stream.text == "a "


def test_the_stop_string_that_ended_the_text_is_named_the_earliest_where_two_appear():
    stream = TextStream(stop=("lamp", "the "))
    assert stream.push(b"by the lamp") == "by "
    assert stream.stopped == "the "


def test_a_line_less_indented_than_asked_ends_the_text_before_its_text_as_llama_servers_n_indent():
    stream = TextStream(indent=4)
    out = feed(stream, [b"  x = 1", b"\n    y", b" = 2\n\t   z\n  ", b"return", b" more"])
    assert out == ["  x = 1", "\n    y", " = 2\n\t   z\n  ", "", ""]  # (the first line and tabs count as it is)
    assert stream.outdented and not stream.stopped and stream.text == "  x = 1\n    y = 2\n\t   z\n  "
    blank = TextStream(indent=2)  # an empty line ends it too, as llama-server's does
    assert feed(blank, [b"a\n  b\n", b"\nc"]) == ["a\n  b\n", ""] and blank.outdented
    assert blank.flush() == ""


def test_the_tokens_a_stop_string_took_are_the_last_ones_past_the_shown_text():
    from localspec.engine.text import unshown_tokens

    assert unshown_tokens([b"1", b",", b" ", b"1", b"2"], "1") == 4
    assert unshown_tokens([b"11,", b" 12"], "11") == 1  # (one straddling the stop's start is counted shown)
    assert unshown_tokens([b"ab", b"c"], "abc") == 0
    assert unshown_tokens([], "") == 0
