# frozen_string_literal: true

require_relative "test_helper"
require "strobe/gzip_pipe"

# The gzip stream that deflates in a thread of its own (pprof and .gz files).
class TestGzipPipe < Minitest::Test
  CHUNKS = Array.new(40) { |i| Random.new(i).bytes(64 * 1024) + ("row #{i};" * 4000) }.freeze

  def deflater_threads
    Thread.list.count { |t| t != Thread.current && t.alive? }
  end

  def test_what_is_written_is_what_gunzips_in_order
    out = StringIO.new("".b)
    before = deflater_threads
    Strobe::GzipPipe.open(out, Zlib::BEST_SPEED) { |gz| CHUNKS.each { |c| gz.write(c) } }
    assert_equal CHUNKS.join, Zlib.gunzip(out.string)
    assert_equal before, deflater_threads, "the deflating thread is over"
    refute out.closed?, "the caller's IO stays open"
  end

  def test_a_string_changed_after_it_was_written_is_written_as_it_was
    out = StringIO.new("".b)
    Strobe::GzipPipe.open(out, Zlib::BEST_SPEED) do |gz|
      buffer = +"first"
      gz.write(buffer)
      buffer.replace("second")
      gz.write(buffer)
    end
    assert_equal "firstsecond", Zlib.gunzip(out.string)
  end

  # An IO that fails part way, as a full disk or a closed pipe does.
  class FailingIO
    def initialize(after)
      @left = after
    end

    def write(data)
      raise Errno::ENOSPC if (@left -= data.bytesize).negative?

      data.bytesize
    end
  end

  def test_an_error_writing_the_io_reaches_the_writer
    before = deflater_threads
    written = 0
    assert_raises(Errno::ENOSPC) do
      Strobe::GzipPipe.open(FailingIO.new(100_000), Zlib::NO_COMPRESSION) do |gz|
        CHUNKS.each do |c|
          gz.write(c)
          written += 1
        end
      end
    end
    assert_operator written, :<, CHUNKS.size, "the writer learnt of it before the end, not after every chunk"
    assert_equal before, deflater_threads
  end

  def test_an_error_in_the_writer_is_its_own_and_leaves_no_thread
    before = deflater_threads
    error = assert_raises(ArgumentError) do
      Strobe::GzipPipe.open(StringIO.new("".b), Zlib::BEST_SPEED) do |gz|
        gz.write(CHUNKS[0])
        raise ArgumentError, "the exporter's own error"
      end
    end
    assert_equal "the exporter's own error", error.message
    assert_equal before, deflater_threads
  end
end
