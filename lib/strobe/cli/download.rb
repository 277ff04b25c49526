# frozen_string_literal: true

# Downloading a profile for `strobe report URL`: http:// only, into a
# temporary file, bounded in time and memory whatever the server does.

require "socket"
require "uri"
require_relative "../profile_file"
require_relative "../version"

module Strobe
  class CLI
    # A profile that could not be downloaded; its message says why.
    class DownloadError < StandardError; end

    # A profile at an http:// URL, such as the strobe.json link `strobe serve`
    # prints:
    #
    #   Download.new(url).open { |path| ... }   # raises DownloadError
    #
    # An HTTP/1.1 GET of its own (Net::HTTP reads header lines into a buffer
    # without a bound and retries a GET that timed out): one deadline for the
    # whole download, connecting included; a cap on the status line and
    # headers (interim 1xx responses count towards it); the body, by
    # Content-Length, chunked or up to the end of the connection, capped and
    # written to the file as it comes.
    class Download
      # What is taken for a URL (https:// too, to refuse it in words).
      URL = %r{\Ahttps?://}i
      # The most a body may be (the most the profile loader inflates a file
      # to) and its status line and headers.
      LIMIT = ProfileFile::MAX_INFLATED
      HEAD_LIMIT = 64 << 10
      # The longest line giving a chunk's size (with extensions).
      CHUNK_LINE_LIMIT = 4 << 10
      # Seconds the whole download may take.
      DEADLINE = 60
      READ_SIZE = 64 << 10
      ENCODINGS = ["", "identity", "gzip", "x-gzip"].freeze
      # What Socket.tcp raises at its timeouts (IO::TimeoutError from Ruby 3.2).
      CONNECT_TIMEOUTS = [Errno::ETIMEDOUT, (IO::TimeoutError if defined?(IO::TimeoutError))].compact.freeze
      TOKEN = /\A[!#$%&'*+\-.^_`|~0-9A-Za-z]+\z/

      class << self
        # Seconds the whole download may take: DEADLINE unless set (a test
        # sets it lower).
        attr_writer :deadline

        def deadline
          @deadline || DEADLINE
        end

        def url?(path)
          path.match?(URL)
        end
      end

      def initialize(url)
        @url = url
      end

      # Downloads the URL into a temporary file and yields its path; the file
      # is removed after. Gzip is asked for and kept as it came: the loader's
      # checks of gzipped files apply to it.
      def open
        require "tempfile"
        uri = begin
          URI.parse(@url)
        rescue URI::InvalidURIError => e
          raise DownloadError, "not a valid URL (#{e.message})"
        end
        raise DownloadError, "only http:// URLs can be downloaded" if uri.is_a?(URI::HTTPS) || !uri.is_a?(URI::HTTP)
        raise DownloadError, "the URL names no host" if uri.host.to_s.empty?

        Tempfile.create("strobe-download") do |file|
          file.binmode
          fetch(uri, file)
          file.flush
          yield file.path
        end
      end

      private

      def fetch(uri, file)
        seconds = self.class.deadline
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
        socket = connect(uri, deadline, seconds)
        connection = Connection.new(socket, deadline, "the server did not send the whole profile within #{seconds} s")
        connection.write(request(uri))
        headers = response_headers(connection)
        read_body(connection, headers, file)
      rescue SystemCallError => e
        raise DownloadError, system_reason(e)
      rescue SocketError, IOError => e
        raise DownloadError, e.message
      ensure
        socket&.close
      end

      def connect(uri, deadline, seconds)
        left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        Socket.tcp(uri.hostname, uri.port, connect_timeout: left, resolv_timeout: left)
      rescue *CONNECT_TIMEOUTS
        raise DownloadError, "no connection within #{seconds} s"
      end

      def request(uri)
        "GET #{uri.request_uri} HTTP/1.1\r\nHost: #{uri.host}:#{uri.port}\r\nAccept-Encoding: gzip\r\n" \
          "User-Agent: strobe/#{VERSION}\r\nConnection: close\r\n\r\n"
      end

      # The final response's headers ({"name" => [values]}), after any
      # interim (1xx) responses; raises unless its status is 200.
      def response_headers(connection)
        budget = HEAD_LIMIT
        loop do
          lines = []
          loop do
            line = connection.line(budget)
            raise DownloadError, "the response's status line and headers are over #{HEAD_LIMIT >> 10} KB" unless line

            budget -= line.bytesize + 2
            break if line.empty? && !lines.empty? # (empty lines before a status line are skipped)

            lines << line unless line.empty?
          end
          code, reason, headers = parse_head(lines)
          next if code.between?(100, 199) && code != 101

          raise DownloadError, "HTTP #{code} #{reason}".strip unless code == 200

          return headers
        end
      end

      def parse_head(lines)
        status = lines.shift.to_s.match(%r{\AHTTP/1\.[01] (\d\d\d)(?: (.*))?\z}n)
        raise DownloadError, "the server's answer is not an HTTP response" unless status

        headers = {}
        last = nil
        lines.each do |line|
          if line.start_with?(" ", "\t") && last # a folded line continues the header before
            last[-1] = "#{last[-1]} #{line.strip}"
            next
          end
          name, value = line.split(":", 2)
          raise DownloadError, "the server sent a malformed header line" unless value && name.match?(TOKEN)

          last = (headers[name.downcase] ||= [])
          last << value.strip
        end
        [status[1].to_i, status[2].to_s.strip, headers]
      end

      def read_body(connection, headers, file)
        encoding = header(headers, "content-encoding").downcase
        raise DownloadError, "the server sent it in #{encoding}, not gzip" unless ENCODINGS.include?(encoding)

        transfer = header(headers, "transfer-encoding").downcase
        return read_chunked(connection, file) if transfer == "chunked"
        raise DownloadError, "the server sent it with Transfer-Encoding #{transfer}" unless transfer.empty?

        length = content_length(headers)
        size = connection.copy(length || LIMIT + 1) { |chunk| file.write(chunk) }
        raise DownloadError, too_large if size > LIMIT
        return unless length && size < length

        raise DownloadError, "the connection closed after #{size} of #{length} bytes"
      end

      # Chunks up to the last (size 0); its trailers are left unread (the
      # connection closes).
      def read_chunked(connection, file)
        size = 0
        loop do
          line = connection.line(CHUNK_LINE_LIMIT)
          digits = line && line[/\A\h{1,16}(?=[ \t;]|\z)/n]
          raise DownloadError, "the server sent malformed chunked data" unless digits

          length = digits.to_i(16)
          return if length.zero?

          size += length
          raise DownloadError, too_large if size > LIMIT

          got = connection.copy(length) { |chunk| file.write(chunk) }
          raise DownloadError, "the connection closed in the middle of a chunk" if got < length
          raise DownloadError, "the server sent malformed chunked data" unless connection.line(2) == ""
        end
      end

      # Content-Length as an Integer (nil when there is none); raises when
      # it is malformed or over LIMIT.
      def content_length(headers)
        values = headers.fetch("content-length", []).flat_map { |v| v.split(",").map(&:strip) }.uniq
        return nil if values.empty?
        raise DownloadError, "the server sent a malformed Content-Length" unless values.size == 1 && values[0].match?(/\A\d+\z/)
        raise DownloadError, too_large if values[0].to_i > LIMIT

        values[0].to_i
      end

      # A header's values as one ("" when there is none).
      def header(headers, name)
        headers.fetch(name, []).join(", ").strip
      end

      def too_large
        "larger than #{LIMIT >> 20} MB, the most a profile may be"
      end

      # The reason without the call Ruby adds, as CLI#system_reason words it.
      def system_reason(error)
        error.class < SystemCallError ? error.class.new.message : error.message
      end

      # A connection's bytes, buffered: each wait for the socket ends at the
      # deadline (DownloadError, with the message given), and at most one
      # read's worth is buffered beyond what is asked for.
      class Connection
        def initialize(socket, deadline, late)
          @socket = socket
          @deadline = deadline
          @late = late
          @buffer = "".b
        end

        def write(data)
          until data.empty?
            written = @socket.write_nonblock(data, exception: false)
            next wait(writable: true) if written == :wait_writable

            data = data.byteslice(written..)
          end
        end

        # The next line without its end (CRLF, or LF alone); nil when it is
        # longer than limit bytes with its end. Raises at the end of the
        # connection.
        def line(limit)
          until (at = @buffer.index("\n"))
            return nil if @buffer.bytesize >= limit
            raise DownloadError, "the connection closed before the response was complete" unless fill
          end
          return nil if at + 1 > limit

          @buffer.slice!(0, at + 1).chomp
        end

        # Yields the next bytes as they come, up to count of them or the end
        # of the connection; returns how many came.
        def copy(count)
          copied = 0
          while copied < count && (!@buffer.empty? || fill)
            chunk = @buffer.bytesize > count - copied ? @buffer.slice!(0, count - copied) : @buffer
            @buffer = "".b if chunk.equal?(@buffer)
            copied += chunk.bytesize
            yield chunk
          end
          copied
        end

        private

        # Reads what has come into the buffer; false at the end of the
        # connection.
        def fill
          loop do
            raise DownloadError, @late if left <= 0

            data = @socket.read_nonblock(READ_SIZE, exception: false)
            return false if data.nil?
            next wait if data == :wait_readable

            @buffer << data
            return true
          end
        end

        def wait(writable: false)
          ready = writable ? IO.select(nil, [@socket], nil, [left, 0].max) : IO.select([@socket], nil, nil, [left, 0].max)
          raise DownloadError, @late unless ready
        end

        def left
          @deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        end
      end
    end
  end
end
