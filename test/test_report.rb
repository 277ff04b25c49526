# frozen_string_literal: true

require "test_helper"
require "stringio"
require "strobe/report"

class TestReport < Minitest::Test
  # 188 samples: A#pow 91 and A#concat 75 under A#run (10 self) under <main>,
  # and 12 GC samples (8 marking, 4 sweeping). One sample was missed.
  def fixture(**overrides)
    {
      version: 1.2, mode: :wall, interval: 1000,
      samples: 188, gc_samples: 12, missed_samples: 1, metadata: {},
      frames: {
        1 => { name: "<main>", file: "a.rb", line: 1, total_samples: 176, samples: 0, edges: { 2 => 176 } },
        2 => { name: "A#run", file: "a.rb", line: 3, total_samples: 176, samples: 10, edges: { 3 => 91, 4 => 75 },
               lines: { 4 => [91, 0], 5 => [75, 0], 6 => [10, 10] } },
        3 => { name: "A#pow", file: "a.rb", line: 9, total_samples: 91, samples: 91 },
        4 => { name: "A#concat", file: "a.rb", line: 13, total_samples: 75, samples: 75 },
        5 => { name: "(garbage collection)", file: "", total_samples: 12, samples: 0, edges: { 6 => 8, 7 => 4 } },
        6 => { name: "(marking)", file: "", total_samples: 8, samples: 8 },
        7 => { name: "(sweeping)", file: "", total_samples: 4, samples: 4 },
      },
    }.merge(overrides)
  end

  def text(result, **options)
    io = StringIO.new
    Strobe::Report.new(result).print_text(io, **options)
    io.string
  end

  HEADER = [
    "==================================",
    "  Mode: wall(1000)",
    "  Samples: 188 (0.53% miss rate)",
    "  GC: 12 (6.38%)",
    "==================================",
    "     TOTAL    (pct)     SAMPLES    (pct)     FRAME",
  ].freeze

  def lines(*rows)
    rows.map { |row| "#{row}\n" }.join
  end

  def test_text_report_in_stackprof_layout_sorted_by_self_samples
    expected = lines(
      *HEADER,
      "        91  (48.4%)          91  (48.4%)     A#pow",
      "        75  (39.9%)          75  (39.9%)     A#concat",
      "       176  (93.6%)          10   (5.3%)     A#run",
      "         8   (4.3%)           8   (4.3%)     (marking)",
      "         4   (2.1%)           4   (2.1%)     (sweeping)",
      "        12   (6.4%)           0   (0.0%)     (garbage collection)",
      "       176  (93.6%)           0   (0.0%)     <main>"
    )
    assert_equal expected, text(fixture)
  end

  def test_sort_by_total_breaks_ties_by_name
    expected = lines(
      *HEADER,
      "       176  (93.6%)           0   (0.0%)     <main>",
      "       176  (93.6%)          10   (5.3%)     A#run",
      "        91  (48.4%)          91  (48.4%)     A#pow",
      "        75  (39.9%)          75  (39.9%)     A#concat",
      "        12   (6.4%)           0   (0.0%)     (garbage collection)",
      "         8   (4.3%)           8   (4.3%)     (marking)",
      "         4   (2.1%)           4   (2.1%)     (sweeping)"
    )
    assert_equal expected, text(fixture, sort_by_total: true)
  end

  def test_limit_keeps_the_first_rows
    lines = text(fixture, limit: 2).lines
    assert_equal 8, lines.size
    assert_equal ["A#pow", "A#concat"], lines.last(2).map { |line| line.split("     ").last.chomp }
    assert_equal text(fixture), text(fixture, limit: 100)
  end

  def test_order_does_not_depend_on_the_order_of_frames
    reversed = fixture(frames: fixture[:frames].to_a.reverse.to_h)
    assert_equal text(fixture), text(reversed)
    assert_equal text(fixture, sort_by_total: true), text(reversed, sort_by_total: true)
  end

  def test_rows_are_the_data_behind_the_table
    rows = Strobe::Report.new(fixture).rows(limit: 3)
    assert_equal [[3, "A#pow", 91, 91], [4, "A#concat", 75, 75], [2, "A#run", 176, 10]],
                 rows.map { |row| [row.id, row.name, row.total, row.self_samples] }
    assert_equal ["a.rb", 3], [rows.last.file, rows.last.line]
  end

  def test_percentages
    report = Strobe::Report.new(fixture)
    assert_in_delta 100.0 / 189, report.miss_rate
    assert_in_delta 100.0 * 12 / 188, report.gc_rate
    assert_in_delta 50.0, report.percent(94)
  end

  def test_mode_may_be_a_string_and_line_may_be_missing
    result = fixture(mode: "cpu", interval: 250)
    result[:frames][3].delete(:line)
    assert_includes text(result), "  Mode: cpu(250)\n"
    assert_includes text(result), "A#pow"
  end

  def test_custom_mode_has_no_interval
    assert_includes text(fixture(mode: :custom, interval: nil)), "  Mode: custom\n"
  end

  def test_zero_samples
    expected = lines(
      "==================================",
      "  Mode: wall(1000)",
      "  Samples: 0 (0.00% miss rate)",
      "  GC: 0 (0.00%)",
      "==================================",
      "  No samples were collected."
    )
    assert_equal expected, text(fixture(samples: 0, gc_samples: 0, missed_samples: 0, frames: {}))
  end

  def test_zero_samples_all_missed
    output = text(fixture(samples: 0, gc_samples: 0, missed_samples: 5, frames: {}))
    assert_includes output, "  Samples: 0 (100.00% miss rate)\n"
    assert_includes output, "No samples were collected."
  end

  def test_missing_counts_and_frames_are_zero
    output = text({ mode: :wall, interval: 1000, samples: 3, frames: nil })
    assert_includes output, "  Samples: 3 (0.00% miss rate)\n  GC: 0 (0.00%)\n"
    assert output.end_with?("FRAME\n")
  end

  def test_rejects_what_is_not_a_result
    assert_raises(ArgumentError) { Strobe::Report.new([]) }
    assert_raises(ArgumentError) { Strobe::Report.new({ frames: [] }) }
    assert_raises(ArgumentError) { Strobe::Report.new(fixture).rows(limit: -1) }
  end

  def test_prints_to_stdout_by_default
    out, = capture_io { Strobe::Report.new(fixture).print_text(limit: 1) }
    assert out.end_with?("A#pow\n")
  end

  # The C table against the same table made in Ruby: percentages as
  # format("(%2.1f%%)") writes them (ties of the rounding included), rows in
  # the order of #rows (count, then name byte by byte, then id), names as
  # Report.printable shows them, for names sharing long prefixes, differing
  # in length, repeated, and not ASCII.
  def test_rows_as_ruby_formats_and_sorts_them
    rng = Random.new(7)
    prefix = "Component::Billing::InvoiceRenderer#"
    names = ["", "a", "ab", "ab\0", "abc", "b", "\u00e9t\u00e9", "Z"].flat_map { |n| [prefix + n, n] } +
            Array.new(60) { |i| "#{prefix}m#{i % 23}" }
    [1, 3, 8, 200, 2000, 999_983, 2**40 + 3, 2**62].each do |samples|
      counts = [0, 1, 3, 5, samples, samples / 2, samples / 3, samples / 8] + Array.new(50) { rng.rand(samples + 1) }
      counts += counts.first(20) # equal counts, to be ordered by name
      frames = counts.each_with_index.to_h do |count, i|
        [1000 - i, { name: names[i % names.size], file: "x.rb", line: 1, total_samples: count,
                     samples: counts[(i * 7) % counts.size] }]
      end
      result = fixture(samples: samples, frames: frames)
      pct = ->(n) { format("(%2.1f%%)", 100.0 * n / samples) }
      expected = Strobe::Report.new(result).rows.map do |row|
        format("%10d %8s  %10d %8s     %s\n", row.total, pct[row.total], row.self_samples, pct[row.self_samples],
               Strobe::Report.printable(row.name))
      end
      assert_equal expected.join, text(result).lines.drop(HEADER.size).join, "samples: #{samples}"
    end
  end

  # The same table as stackprof's own text report of a stackprof result (its
  # order of equal counts is unspecified, hence the sorted lines; its header
  # differs for custom mode, "custom()").
  def test_matches_stackprof_on_a_stackprof_result
    require "stackprof"
    result = StackProf.run(mode: :custom, raw: false) do
      3.times { StackProf.sample }
      2.times { Array.new(1) { StackProf.sample } }
    end
    ours = text(result)
    theirs = StringIO.new
    StackProf::Report.new(result).print_text(false, nil, nil, nil, nil, nil, theirs)
    assert_equal table_rows(theirs.string), table_rows(ours)
  end
end
