# frozen_string_literal: true

require "zlib"

module Strobe
  # A gzip stream over an IO whose deflating runs in a thread of its own,
  # beside the code that writes to it: Zlib deflates without the GVL, so an
  # exporter encoding a large profile (C, holding the GVL) and the deflate of
  # what it wrote so far use two CPUs. pprof of 10 million samples spent a
  # third of its time in deflate (bench/scale.rb).
  #
  # GzipPipe.open(io, level) { |gz| ... } yields something to #write to and
  # finishes the stream (io is left open). At most DEPTH chunks wait, so
  # memory stays bounded whatever the sizes. An error writing io (a full
  # disk, EPIPE) is raised in the writing thread at its next #write or at
  # the end. Not in a trap handler, where Ruby refuses the Queue's lock, as
  # it does Zlib's own (Strobe's toggle writes gzipped files on a thread).
  class GzipPipe
    DEPTH = 4

    # Hands writes on to an IO, and closing it only flushes: a gzip stream
    # finished over a caller's IO leaves that IO open.
    class KeepOpen
      def initialize(io)
        @io = io
      end

      def write(data)
        @io.write(data)
      end

      def flush
        @io.flush if @io.respond_to?(:flush)
        self
      end

      def close
        flush
        nil
      end
    end

    def self.open(io, level)
      pipe = new(io, level)
      begin
        result = yield pipe
      rescue Exception # rubocop:disable Lint/RescueException -- Interrupt too: the thread is not left behind
        pipe.abandon
        raise
      end
      pipe.finish
      result
    end

    def initialize(io, level)
      @queue = SizedQueue.new(DEPTH)
      @deflater = Thread.new do
        Thread.current.report_on_exception = false
        Thread.current.name = "strobe gzip" # (a profile running meanwhile shows it so)
        Zlib::GzipWriter.wrap(KeepOpen.new(io), level) do |gz|
          while (chunk = @queue.pop)
            gz.write(chunk)
          end
        end
      ensure
        @queue.close # a writer blocked on a full queue learns it is over
      end
    end

    # data is not copied: a String changed after this call is copied by Ruby
    # then (dup shares the bytes until one side changes).
    def write(data)
      @queue.push(data.dup)
      # The deflater gets the GVL now, not at the next time slice: it hands
      # it back as soon as it deflates (the caller is in C, holding it).
      Thread.pass
      data.bytesize
    rescue ClosedQueueError
      @deflater.value # raises what ended it
      raise IOError, "gzip stream closed"
    end

    def flush
      self
    end

    # Every chunk deflated, the stream's end written; raises what writing io
    # raised.
    def finish
      @queue.close
      @deflater.value
      nil
    end

    # The writing side failed: the deflater stops; what it raises is not
    # the caller's error.
    def abandon
      @queue.clear
      @queue.close
      @deflater.join
    rescue StandardError
      nil
    end
  end
end
