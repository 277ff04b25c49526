# frozen_string_literal: true

require "test_helper"

# Strobe.snapshot(reset: true): the profile so far, and profiling goes on
# afresh; every sample lands in one of the two results, none in both.
class TestSnapshotReset < Minitest::Test
  def before_the_cut(seconds) = spin(seconds)
  def after_the_cut(seconds) = spin(seconds)

  def names(result) = result[:frames].values.map { |f| f[:name] }

  def test_a_reset_splits_the_profile_at_that_instant
    Strobe.start(mode: :wall, interval: 1000, raw: true, metadata: { app: "x" })
    before_the_cut(0.1)
    first = Strobe.snapshot(reset: true)
    after_the_cut(0.1)
    Strobe.stop
    second = Strobe.results
    assert_includes names(first), "TestSnapshotReset#before_the_cut"
    refute_includes names(first), "TestSnapshotReset#after_the_cut"
    assert_includes names(second), "TestSnapshotReset#after_the_cut"
    refute_includes names(second), "TestSnapshotReset#before_the_cut", "frames of the earlier period are left out"
    [first, second].each do |r|
      assert_equal r[:samples], r[:raw_sample_timestamps].size
      assert_equal r[:samples], r[:threads].values.sum { |t| t[:samples] }
      assert_equal({ app: "x" }, r[:metadata])
    end
    assert_operator first[:raw_sample_timestamps].max, :<, second[:raw_sample_timestamps].min
    assert_operator first[:started_at], :<, second[:started_at]
  end

  def test_without_reset_nothing_is_forgotten
    Strobe.start(mode: :wall, interval: 1000)
    before_the_cut(0.05)
    first = Strobe.snapshot
    Strobe.stop
    assert_operator Strobe.results[:samples], :>=, first[:samples]
  end

  def test_reset_must_be_true_or_false
    assert_raises(ArgumentError) { Strobe.snapshot(reset: 1) }.then { |e| assert_match(/reset/, e.message) }
  end
end
